"""Shared fixtures: the tiny pair (built once per session), a very small pair for statistics, and a way to
serve the app on a free local port."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``./test.sh`` runs one worker per core, at most two), each worker on CPUs of its own:
    llama.cpp, torch's real-pair tests and Ray count the CPUs this process may use, and two workers each running two
    spinning threads on two cores wait on each other's descheduled threads. Processes a test starts inherit the
    share."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if count < 2 or not name.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    share = cpus[int(name[2:]) % count::count] if len(cpus) >= count else []
    if share:
        os.sched_setaffinity(0, share)


_pin_xdist_worker()
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
    config._disco_gguf = (cache.gguf_dir(), {p.name for p in cache.gguf_dir().iterdir()})


@pytest.fixture(scope="module", autouse=True)
def _cache_left_as_found(request):
    """A module leaves ``DISCO_CACHE`` as it found it: a fixture of wider scope that pointed it at an empty folder
    sent every later test of the session to a cache without the prepared models (the fp32 real pair was then joined
    and converted again: 115-141 s of setup instead of 18-20 s)."""
    before = os.environ.get("DISCO_CACHE")
    yield
    after = os.environ.get("DISCO_CACHE")
    assert after == before, f"{request.module.__name__} left DISCO_CACHE at {after} (it was {before})"


SCRAP_PREFIXES = ("assistant-", "tokenizer-")  # what the tiny GGUF pairs leave in the shared gguf folder
SCRAP_BYTES = 1 << 20                          # the embedded pair's files (its tokenizer: 11 MB) are larger


def _size(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def pytest_unconfigure(config):
    """The gguf folder is the user's own (linked above, so the embedded pair is prepared once per machine): remove what
    this session's tiny GGUF pairs added to it (their re-quantized assistants and tokenizers), nothing that was there
    before, nothing of the embedded pair's."""
    import shutil

    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller cleans up once every worker is done (a worker's own scrap may be
        # another worker's input meanwhile)
    folder, before = getattr(config, "_disco_gguf", (None, None))
    if folder is None or not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.name in before or not path.name.startswith(SCRAP_PREFIXES):
            continue
        try:
            if _size(path) < SCRAP_BYTES:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        except OSError:
            pass  # another process's file, or gone already: the next session tries again only for its own


def pytest_collection_modifyitems(config, items):
    """The fast tier (``./test.sh -m fast``, for working): every test under tests/unit that is not marked ``slow``.
    The full suite runs everything."""
    unit = os.path.join("tests", "unit") + os.sep
    for item in items:
        if unit in str(item.path) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)
