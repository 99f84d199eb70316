"""ZeroGPU for real: on a ZeroGPU Space a model pass outside ``@spaces.GPU`` has no GPU. Here a stand-in ``spaces``
package marks its GPU context, and every model pass outside it raises: the start-up warm-up, the background profile,
a race, a sweep and the Sweep's detail replay must all run inside one."""

from __future__ import annotations

import functools
import importlib.machinery
import inspect
import sys
import threading
import types

import pytest

from disco.models.pair import TorchSession

INSIDE = threading.local()


def _fake_spaces() -> types.ModuleType:
    module = types.ModuleType("spaces")
    module.__spec__ = importlib.machinery.ModuleSpec("spaces", None)
    module.calls = []

    def GPU(fn=None, duration=None):  # noqa: N802 - the package's own name
        def wrap(f):
            if inspect.isgeneratorfunction(f):
                @functools.wraps(f)
                def inner(*args, **kwargs):  # Gradio may drive each step from another worker thread: mark each
                    module.calls.append((f.__name__, duration))
                    steps = f(*args, **kwargs)
                    try:
                        while True:
                            INSIDE.on = True
                            try:
                                value = next(steps)
                            except StopIteration:
                                return
                            finally:
                                INSIDE.on = False
                            yield value
                    finally:
                        steps.close()
            else:
                @functools.wraps(f)
                def inner(*args, **kwargs):
                    module.calls.append((f.__name__, duration))
                    INSIDE.on = True
                    try:
                        return f(*args, **kwargs)
                    finally:
                        INSIDE.on = False
            return inner
        return wrap(fn) if fn is not None else wrap

    module.GPU = GPU
    return module


@pytest.fixture
def zero_gpu(monkeypatch, tmp_path):
    # an earlier test's app may still be loading and profiling in the background: its passes are not this test's
    for thread in threading.enumerate():
        if thread.name == "disco-model-loader" and thread is not threading.current_thread():
            thread.join(timeout=600)
    spaces = _fake_spaces()
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path))
    real = TorchSession.forward
    outside = []

    def forward(self, *args, **kwargs):
        if not getattr(INSIDE, "on", False):
            outside.append(threading.current_thread().name)
            raise RuntimeError("a model pass outside a ZeroGPU context")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TorchSession, "forward", forward)
    return spaces, outside


def test_the_warm_up_and_the_background_profile_run_inside_the_gpu_context(zero_gpu):
    from disco.app.loader import ModelLoader

    spaces, outside = zero_gpu
    loader = ModelLoader("tiny")
    loader._load()  # what the start-up thread runs: load, warm up, then the quick and the full profile
    assert loader.error is None and loader.profile_error is None, (loader.error, loader.profile_error)
    assert loader.profile is not None and not outside
    names = [name for name, _ in spaces.calls]
    assert names.count("warmup") == 1 and names.count("measure") == 2


def test_races_sweeps_and_the_detail_replay_run_inside_the_gpu_context(zero_gpu, serve_app):
    from gradio_client import Client

    import app
    from disco import suites

    spaces, outside = zero_gpu
    demo = app.build_demo("tiny")
    with serve_app(demo) as url:
        client = Client(url, verbose=False)
        race = client.predict("def f(x):", max_new_tokens=6, api_name="/compare")
        sweep = client.predict(["code-complete-fib"], "1,2", "0.4", "4", False, False, 8, api_name="/sweep")
        detail = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "show_detail")
        prompt = next(p for p in suites.load_suite().prompts if p.id == "code-complete-fib")
        figure, table = detail("static:2", prompt.id, {"records": {prompt.id: prompt}, "max_new_tokens": 8,
                                                        "cost_profile": "measured"})
    assert "Done" in race[0] and "1/1 prompts replayed" in sweep[0], (race[0], sweep[0])
    assert len(table) >= 1 and not outside, outside
    names = {name for name, _ in spaces.calls}
    assert {"compare", "run_sweep", "show_detail"} <= names
