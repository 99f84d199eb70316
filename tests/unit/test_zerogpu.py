"""ZeroGPU: compute functions go under ``spaces.GPU`` only on a ZeroGPU Space with the package installed."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from disco.app import zerogpu


def compute(x, request=None):
    yield x + 1


@pytest.fixture
def fake_spaces(monkeypatch):
    calls = []
    module = types.ModuleType("spaces")
    module.__spec__ = importlib.machinery.ModuleSpec("spaces", None)

    def GPU(fn=None, duration=None):  # noqa: N802 - the package's own name
        def wrap(f):
            def inner(*args, **kwargs):
                calls.append(("run", f.__name__))
                return f(*args, **kwargs)
            inner.__wrapped__ = f
            calls.append(("wrap", f.__name__, duration))
            return inner
        return wrap(fn) if fn is not None else wrap

    module.GPU = GPU
    monkeypatch.setitem(sys.modules, "spaces", module)
    return calls


def test_off_spaces_nothing_changes(monkeypatch, fake_spaces):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert zerogpu.gpu(compute, 240) is compute and not zerogpu.on_zero_gpu()
    assert fake_spaces == []


def test_without_the_package_nothing_changes(monkeypatch):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setitem(sys.modules, "spaces", None)  # import fails, find_spec says absent
    monkeypatch.setattr(zerogpu.importlib.util, "find_spec", lambda name: None)
    assert zerogpu.gpu(compute, 240) is compute


def test_on_zero_gpu_the_function_runs_under_spaces_gpu(monkeypatch, fake_spaces):
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    wrapped = zerogpu.gpu(compute, 240)
    assert wrapped is not compute
    assert list(wrapped(1)) == [2]
    assert fake_spaces == [("wrap", "compute", 270), ("run", "compute")]
    assert zerogpu.gpu(compute, 0) is not compute  # no budget: the package's default duration


def test_the_app_wraps_compare_and_sweep_on_zero_gpu(monkeypatch, fake_spaces):
    import app

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    demo = app.build_demo("tiny")
    wrapped = {c[1] for c in fake_spaces if c[0] == "wrap"}
    assert {"compare", "run_sweep"} <= wrapped
    demo.close()
