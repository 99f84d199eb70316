"""The keys cached measurements are filed under: this machine (CPU, flags, library versions, threads) and the
engine that runs the models, so a measurement is reused only where it still holds (``machine_key``)."""

from __future__ import annotations

import os
import platform

from disco.machine import KEY_FORMAT, cpu_info
from disco.models import llama


def machine_key(models: str, device, engine: str = "torch") -> dict:
    """Everything that changes which numerics are fastest; a measurement is reused only for an equal key. For the
    llama.cpp engine: its version, its threads and whether its exact (batch-invariant) kernels are on."""
    import torch

    info = cpu_info()
    key = {"format": KEY_FORMAT, "models": models, "device": str(device), "cpu": info["cpu"], "flags": info["flags"],
           "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "machine": platform.machine()}
    if engine != "torch":  # torch keys stay as they were before there was a second engine
        key.update(engine=engine, llama_cpp=llama.version(), threads=llama.threads(), exact=llama.exact_mode())
        if llama.exact_mode() and llama.fast_prefill_mode():
            key["fast_prefill"] = True
        if llama.kernels():  # a build with one CPU backend per instruction set: which one runs here
            key["cpu_variant"] = llama.kernels()
    return key
