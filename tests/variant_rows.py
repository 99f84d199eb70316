"""Run in a process of its own (the CPU variant is chosen once per process, ``DISCO_LLAMA_CPU_VARIANT``): do exact
mode's rows stay the one-token rows at every batch size on this variant of llama.cpp's kernels?

    python tests/variant_rows.py MODEL.gguf [K ...]

Prints one JSON line: the variant that ran, and per batch size K whether every row of K-token passes (and every
later row computed from the cache they wrote) equals what one-token passes compute, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from disco.models import cpu_variant, llama

ROOT = Path(__file__).resolve().parents[1]


def require_variants():
    """llama.cpp's module, or skip: the engine is not installed, or its build has one CPU backend linked in. An
    engine that is installed but cannot start (e.g. no CPU variant could be loaded) fails the test."""
    import importlib.util

    import pytest

    if llama.available() is not None:
        if importlib.util.find_spec("llama_cpp") is None:
            pytest.skip(f"llama-cpp-python is not installed: {llama.available()}")
        pytest.fail(f"llama-cpp-python is installed but does not start: {llama.available()}")
    if llama.kernels() is None:
        pytest.skip("this llama.cpp build has one CPU backend linked in (no variants)")
    return llama


def runnable() -> list[str]:
    """The variants built here that this CPU runs (a placeholder that skips where there are none)."""
    if llama.available() is not None or llama.kernels() is None:
        return ["(none)"]
    return [v.name for v in cpu_variant.runnable(with_opt_in=True)]


def run_on(variant: str, model: Path, ks=(2, 4, 8, 16)) -> dict:
    """This script's answer for ``model`` in a process that runs ``variant``."""
    env = {**os.environ, cpu_variant.VARIANT_ENV: variant, "PYTHONPATH": str(ROOT)}
    env.pop(llama.EXACT_ENV, None)
    proc = subprocess.run([sys.executable, __file__, str(model), *map(str, ks)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rows(model: llama.LlamaModel, prompt: list[int], follow: list[int], k: int) -> torch.Tensor:
    session = model.session()
    session.forward(prompt, 1)
    out = [session.forward(follow[i:i + k], len(follow[i:i + k]))[0] for i in range(0, len(follow), k)]
    out.append(session.forward([2], 1)[0])  # a one-token step on the cache the batches wrote
    return torch.cat(out)


def main(path: str, ks: list[int]) -> dict:
    model = llama.LlamaModel(path)
    assert model.exact, "exact mode is off"
    vocab = model.n_vocab
    prompt = [(11 * i + 7) % (vocab - 10) + 5 for i in range(24)]
    follow = [(7 * i + 3) % (vocab - 10) + 5 for i in range(16)]
    single = rows(model, prompt, follow, 1)
    return {"kernels": llama.kernels(), "equal": {k: bool(torch.equal(rows(model, prompt, follow, k), single))
                                                  for k in ks}}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], [int(k) for k in sys.argv[2:]] or [2, 4, 8, 16])))
