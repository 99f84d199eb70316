"""This machine, as far as it changes a measurement: the CPU and the flags that decide its kernels, the library
versions and thread count. Every cached measurement is keyed by it; every figure we print names it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

KEY_FORMAT = 1
# CPU features that decide which kernels oneDNN / torch / ggml use
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx512_vnni", "avx_vnni", "avx512_fp16",
         "fma", "f16c", "asimd", "sve", "bf16")


def cpu_info() -> dict:
    """The CPU's model name and the flags that matter for kernel choice (empty where /proc/cpuinfo is missing)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    return {"cpu": model, "flags": sorted(f for f in FLAGS if f in flags)}


def machine_key(models: str, device, engine: str = "torch") -> dict:
    """Everything that changes which numerics are fastest; a measurement is reused only for an equal key. For the
    llama.cpp engine: its version, its threads and whether its exact (batch-invariant) kernels are on."""
    import torch

    info = cpu_info()
    key = {"format": KEY_FORMAT, "models": models, "device": str(device), "cpu": info["cpu"], "flags": info["flags"],
           "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "machine": platform.machine()}
    if engine != "torch":  # torch keys stay as they were before there was a second engine
        from disco.models import llama

        key.update(engine=engine, llama_cpp=llama.version(), threads=llama.threads(), exact=llama.exact_mode())
    return key


def key_hash(key) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def flags_line(key: dict | None = None) -> str:
    """One line naming the CPU and its relevant flags, for every figure we print."""
    key = key or machine_key("-", "cpu")
    isa = f"; ONEDNN_MAX_CPU_ISA={key['onednn_max_cpu_isa']}" if key.get("onednn_max_cpu_isa") else ""
    return f"{key['cpu']} ({', '.join(key['flags']) or 'no listed flags'}{isa}; {key['threads']} threads)"
