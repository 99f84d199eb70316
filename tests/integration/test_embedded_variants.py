"""Exact mode on every CPU variant of llama.cpp's kernels this CPU runs, on the embedded pair's real Q4_K_M / Q6_K
target (the tiny GGUF pair covers F32 and Q8_0 in tests/unit/test_cpu_variants.py): every row of a 4- and a
16-token pass, and every later row computed from the cache they wrote, is the one-token row bit for bit."""

from __future__ import annotations

import pytest

import variant_rows  # tests/ is on the path
from disco.models import llama

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def target_gguf():
    from disco.models import embedded

    variant_rows.require_variants()  # before joining the GGUF files, which takes a while the first time

    return embedded.prepare_gguf(progress=False, log=lambda message: None)["target"]


@pytest.mark.parametrize("variant", variant_rows.runnable())
def test_the_real_target_is_exact_on_every_variant(variant, target_gguf):
    """The variant this process runs gets a 4- and a 16-token pass; the others (slower kernels: plain x86-64 took 55 s
    for both) a 4-token pass, which already crosses the one-token and batched code paths of every quantized type
    (every k of every variant: tests/unit/test_cpu_variants.py, on the tiny GGUF pair)."""
    variant_rows.require_variants()
    chosen = llama.kernels() == variant
    result = variant_rows.run_on(variant, target_gguf, ks=(4, 16) if chosen else (4,))
    assert result["kernels"] == variant and all(result["equal"].values()), result
