"""This machine, as far as it changes a measurement: the CPU and the flags that decide its kernels, the library
versions and thread count. Every figure we print names it; every cached measurement is keyed by it
(``disco.models.keys.machine_key`` adds the engine's own version and settings to what this module reads)."""

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


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS has one; an xdist test worker is pinned to one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def key_hash(key) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def flags_line(key: dict | None = None) -> str:
    """One line naming the CPU and its relevant flags, for every figure we print."""
    if key is None:
        import torch

        key = {**cpu_info(), "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
               "threads": torch.get_num_threads()}
    isa = f"; ONEDNN_MAX_CPU_ISA={key['onednn_max_cpu_isa']}" if key.get("onednn_max_cpu_isa") else ""
    variant = f"; llama.cpp's {key['cpu_variant']} kernels" if key.get("cpu_variant") else ""
    return f"{key['cpu']} ({', '.join(key['flags']) or 'no listed flags'}{isa}; {key['threads']} threads{variant})"
