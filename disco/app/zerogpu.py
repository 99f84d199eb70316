"""Hugging Face ZeroGPU support: every model pass of the app runs under ``@spaces.GPU`` on a ZeroGPU Space.

A ZeroGPU Space lends a GPU only while a function decorated with the ``spaces`` package's ``GPU`` runs
(Spaces sets ``SPACES_ZERO_GPU`` there). Off such a Space, or without the package, ``gpu`` returns the
function unchanged, so nothing changes on a CPU Space, a laptop or in the tests.

What runs a model, and how long it may hold the GPU (from the run budget, ``DISCO_RUN_BUDGET_S``): a race, a sweep,
the Sweep's detail replay and re-costing (the budget + 30 s); the start-up warm-up and a second engine's warm-up
(``WARMUP_S``); the background profile, each of its two passes (the quick one and the full one) in one call of
``profile_seconds()``. ``tests/app/test_zerogpu_passes.py`` runs the app with a stand-in ``spaces`` whose GPU context
is the only place a model pass may happen.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

from disco.limits import Budgets

WARMUP_S = 60


def profile_seconds() -> float:
    """How long one background profile call may hold the GPU: twice a run's budget, at least two minutes."""
    return max(120.0, 2 * Budgets.from_env().run_s)


def on_zero_gpu() -> bool:
    flag = os.environ.get("SPACES_ZERO_GPU", "").strip().lower()
    return flag in ("1", "true", "yes") and importlib.util.find_spec("spaces") is not None


def gpu(fn: Callable, duration_s: float | None = None) -> Callable:
    """``fn`` under ``spaces.GPU(duration=...)`` on a ZeroGPU Space (the GPU is held at most ``duration_s``,
    the run's time budget plus a margin for start-up), else ``fn`` itself."""
    if not on_zero_gpu():
        return fn
    import spaces

    if duration_s is None or duration_s <= 0:
        return spaces.GPU(fn)
    return spaces.GPU(duration=int(duration_s) + 30)(fn)
