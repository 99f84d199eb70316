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


from small_pair import make_small_pair  # noqa: E402  (tests/ is on the path)


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

    app.queued(demo).launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
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
