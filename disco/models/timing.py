"""The one timed-pass helper: what one forward pass of a model costs, the way the engine runs it (a session on top
of a real cache, device synchronised). The numerics decision, the cost profiles and the benchmark's calibration
all measure through it."""

from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable

from disco.models.pair import prefill_boundary


def pass_costs(new_session: Callable[[], object], context: list[int], sizes: Iterable[int], reps: int = 3,
               warm: bool = True) -> dict[int, float]:
    """Median ms of one pass over ``n`` tokens on top of a cache of ``context`` (cropped back after each), for every
    n in ``sizes``. Sizes are interleaved across repetitions so drift hits them alike; with ``warm`` each size runs
    once untimed first (the first pass of a new shape builds its kernels)."""
    session = new_session()
    session.forward(list(context), 1)
    base = len(context)
    filler = context[-1]
    samples: dict[int, list[float]] = {int(n): [] for n in sizes}
    for rep in range(reps + (1 if warm else 0)):
        for n in samples:
            _, ms = session.forward([filler] * n, n)
            session.crop(base)
            if rep or not warm:
                samples[n].append(ms)
    return {n: statistics.median(v) for n, v in samples.items()}


def prefill_costs(new_session: Callable[[], object], ids: list[int], sizes: Iterable[int], reps: int = 3
                  ) -> dict[int, float]:
    """Median ms of a prefill of the first ``n`` tokens of ``ids`` (repeated as needed) on a fresh cache."""
    samples: dict[int, list[float]] = {int(n): [] for n in sizes}
    text = list(ids) or [0]
    for _ in range(reps):
        for n in samples:
            tokens = (text * (n // len(text) + 1))[:n]
            session = new_session()
            prefill_boundary(session, n - 1)  # a prompt's prefill, as every lane's first pass does it
            _, ms = session.forward(tokens, 1)
            samples[n].append(ms)
    return {n: statistics.median(v) for n, v in samples.items()}


def interpolate(points, n: float) -> float:
    """Piecewise-linear in n through measured (n, ms) points (a dict or sorted pairs), linear
    extrapolation beyond the ends: replay's rule, used everywhere a
    pass size between two measured ones is costed."""
    points = sorted(points.items()) if isinstance(points, dict) else list(points)
    if not points:
        return math.nan
    if len(points) == 1:
        return points[0][1] * n / points[0][0]
    if n <= points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif n >= points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        i = next(i for i in range(1, len(points)) if points[i][0] >= n)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
    if x1 == x0:
        return y0
    return max(0.0, y0 + (y1 - y0) * (n - x0) / (x1 - x0))
