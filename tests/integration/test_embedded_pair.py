"""The real Qwen2.5-Coder 1.5B / 0.5B pair (prepared from the PyPI data wheels on first use).

fp32, greedy: speculative output must equal the target's own autoregressive output token for token,
and a correctly loaded pair agrees often (a broken load would not).
"""

from __future__ import annotations

import pytest
import torch

from disco.decode.race import run_all
from disco.decode.settings import DecodeSettings
from disco.machine import usable_cpus

pytestmark = pytest.mark.integration

PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "prose": "Explain in two sentences why the sky is blue.",
}


@pytest.fixture(scope="module")
def real_pair():
    from disco.models import load_pair

    threads = torch.get_num_threads()
    # real models use two cores where this process may (an xdist worker is pinned to one: tests/conftest.py)
    torch.set_num_threads(min(2, usable_cpus()))
    pair = load_pair("embedded", dtype="fp32", log=print)
    pair.warmup()
    yield pair
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_real_pair_is_lossless_in_fp32(real_pair, kind):
    final = run_all(real_pair, PROMPTS[kind], ["autoregressive", "static:4", "threshold:0.4:20"],
                    DecodeSettings(max_new_tokens=16), chat=True)
    ar, static, threshold = final.decoders
    assert len(ar.output_ids) == 16
    assert static.output_ids == ar.output_ids
    assert threshold.output_ids == ar.output_ids
    summaries = {s["strategy"]: s for s in final.summaries()}
    assert summaries["static:4"]["identical_to_autoregressive"] is True
    assert summaries["threshold:0.4:20"]["dtype"] == "fp32"
    if kind == "code":
        assert summaries["static:4"]["acceptance_rate"] > 0.3
        assert summaries["threshold:0.4:20"]["accepted"] > 0
    # the text is real language, not noise from a broken load
    assert any(word in ar.text.lower() for word in ("def", "fib", "the", "sky", "light", "blue", "python", "here"))


def test_real_pair_chat_template_and_eos(real_pair):
    ids = real_pair.encode("hi", chat=True)
    text = real_pair.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    assert 151645 in real_pair.eos_ids
    assert real_pair.context_length >= 32768
