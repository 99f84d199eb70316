"""Hugging Face ZeroGPU support: run the compute functions under ``@spaces.GPU`` on a ZeroGPU Space.

A ZeroGPU Space lends a GPU only while a function decorated with the ``spaces`` package's ``GPU`` runs
(Spaces sets ``SPACES_ZERO_GPU`` there). Off such a Space, or without the package, ``gpu`` returns the
function unchanged, so nothing changes on a CPU Space, a laptop or in the tests.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable


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
