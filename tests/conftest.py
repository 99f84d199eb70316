"""Shared fixtures: the tiny pair (built once per session), a very small pair for statistics, and a way to
serve the app on a free local port."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny models gain nothing from intra-op threads, and on a busy 2-core machine two threads per
# process thrash (measured: 170 ms vs 8 ms per tiny forward). Integration tests raise it again.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_pair():
    from disco.models import load_pair

    pair = load_pair("tiny")
    pair.warmup()
    return pair


class IdTokenizer:
    """A stand-in tokenizer for pairs that work on raw ids (the statistics tests)."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)

    def __len__(self):
        return self.vocab


def make_small_pair(vocab: int = 4, seed: int = 0, sharpness: float = 0.5, noise: float = 0.5):
    """A target and a perturbed copy of it as the assistant, over a tiny vocabulary.

    Their distributions differ clearly but overlap, so drafts are accepted about half the time and
    the rejection rule is exercised on every path. No token is EOS.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from disco.models import ModelPair
    from disco.models.tiny import perturb_

    def model(s: int):
        torch.manual_seed(s)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        m = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            m.lm_head.weight.mul_(sharpness / m.lm_head.weight.std())
        return m

    state = torch.random.get_rng_state()
    try:
        target = model(seed)
        assistant = model(seed)
        perturb_(assistant, noise, seed + 100)
    finally:
        torch.random.set_rng_state(state)
    return ModelPair("small", target, assistant, IdTokenizer(vocab), "small-target", "small-assistant",
                     torch.float32, torch.device("cpu"), 64, (vocab + 1000,))


@pytest.fixture(scope="session")
def small_pair():
    return make_small_pair()


@contextlib.contextmanager
def _serve(demo, **launch_kwargs):
    """Launch ``demo`` in this process on a free local port, one run at a time as ``app.py`` queues it;
    yield its URL; close it afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import app

    app.quiet_queue(demo.queue(default_concurrency_limit=1)).launch(server_name="127.0.0.1", server_port=port,
                                                                    prevent_thread_lock=True, quiet=True,
                                                                    **launch_kwargs)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="session")
def serve_app():
    """``with serve_app(demo) as url: ...``"""
    return _serve


TEST_CLASSIFIER = {  # a hand-made DISCO classifier: goes on while the draft's confidence is high (disco lanes in tests)
    "format": 1, "model": "logistic_regression", "features": ["prob", "entropy", "margin", "index", "log_cumulative"],
    "mean": [0.5, 1.0, 0.3, 3.0, -1.0], "scale": [0.25, 1.0, 0.3, 3.0, 1.0], "coef": [2.0, -0.5, 0.5, -0.3, 0.5],
    "intercept": 0.0, "threshold": 0.5, "meta": {"note": "tests/conftest.py"},
}


def pytest_configure(config):
    """Every test (and every app or CLI process a test starts) uses the hand-made classifier above, so the tests do
    not depend on the trained weights in assets/; and a cache of its own (``DISCO_CACHE``), so tables and
    measurements of the tests never mix with the user's. Only the prepared models are shared with the user's
    cache (linked), so the embedded pair is converted once per machine, not once per test session."""
    import json
    import tempfile
    from pathlib import Path

    from disco import cache

    work = Path(tempfile.mkdtemp(prefix="disco-test-"))
    path = work / "classifier.json"
    path.write_text(json.dumps(TEST_CLASSIFIER))
    os.environ["DISCO_CLASSIFIER"] = str(path)
    real = cache.root()
    (work / "cache").mkdir()
    for shared in (cache.models_dir(), cache.gguf_dir()):
        shared.mkdir(parents=True, exist_ok=True)
        (work / "cache" / shared.relative_to(real)).symlink_to(shared, target_is_directory=True)
    os.environ["DISCO_CACHE"] = str(work / "cache")
