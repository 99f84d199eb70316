"""A roofline's uncertainty: the band its factor ranges span, and fitting the factors to measured passes.

``band`` gives the models at the ends of each uncertain factor's stated range (the devices file's), so an output can
say how much of a conclusion rests on a guess.

A datasheet roofline is a prediction; once some passes have been timed on the device (``scripts/gpu_check.py`` on a
GPU, ``python -m disco profile --batch`` here), the factors it was unsure of (bandwidth and compute efficiency, kernel
and host time) can be fitted to them. A fit is only worth its error on passes it was not fitted to, so
``held_out_report`` splits the passes three ways (small to large passes, one context to others, the target's passes
to the assistant's), never letting a test pass into the training set, and reports median and worst % error.
Reached through ``disco.costs.roofline`` (``fit``, ``held_out_report``, ...), which holds the model itself.
"""

from __future__ import annotations

import math
from pathlib import Path
import statistics
from typing import Mapping

from disco import cache, machine
from disco.costs.errors import CostProfileError
from disco.costs.model import whole_cell
from disco.costs.roofline import (ASSISTANT_SHAPE, TARGET_SHAPE, UNCERTAIN_FACTORS, ModelShape, RooflineCosts,
                                  factor_ranges, fit_path, roofline_costs)
from disco.errors import first_line

SPLITS = ("small-to-large", "context", "target-to-assistant")
FIT_PRIOR = 1e-3  # weight pulling each log-factor towards its nominal value: settles what the points cannot see


def band(profile_text, target_shape=None, assistant_shape=None, *, graphs: bool = True,
         devices=None) -> list[RooflineCosts]:
    """The nominal model, then one model at each end of each uncertain factor's range (the others nominal), then the
    two corners where all factors are at their fastest and at their slowest end. Cost falls with either efficiency and
    rises with kernel and host time, so the last two bound every model inside the ranges."""
    nominal = roofline_costs(profile_text, target_shape, assistant_shape, graphs=graphs, devices=devices)
    ranges = factor_ranges(nominal.entry, graphs)
    models = [nominal]
    for name in UNCERTAIN_FACTORS:
        for end, value in zip(("low", "high"), ranges[name]):
            models.append(nominal.with_factors({**nominal.factors, name: value}, note=f"{name} {end}"))
    fast = {n: ranges[n][1] if n.endswith("efficiency") else ranges[n][0] for n in UNCERTAIN_FACTORS}
    slow = {n: ranges[n][0] if n.endswith("efficiency") else ranges[n][1] for n in UNCERTAIN_FACTORS}
    return models + [nominal.with_factors(fast, note="fastest corner"),
                     nominal.with_factors(slow, note="slowest corner")]


def _points(points) -> list[dict]:
    """Measured passes ``{role, batch, tokens (per row), context, ms}``, checked (one line for a bad one)."""
    checked = []
    for i, p in enumerate(points):
        try:
            role, batch, tokens, context, ms = (str(p["role"]), int(p["batch"]), int(p["tokens"]),
                                                int(p.get("context", 0)), float(p["ms"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CostProfileError(f"measured pass {i}: needs role, batch, tokens, context, ms ({first_line(exc)})") \
                from None
        if role not in ("target", "assistant") or min(batch, tokens) < 1 or context < 0 or not ms > 0 \
                or not math.isfinite(ms):
            raise CostProfileError(f"measured pass {i}: bad values {dict(p)!r}")
        checked.append({"role": role, "batch": batch, "tokens": tokens, "context": context, "ms": ms})
    if not checked:
        raise CostProfileError("no measured passes to fit or test")
    return checked


def predict(costs: RooflineCosts, point: Mapping) -> float:
    """The model's ms for one measured pass (``batch`` rows of ``tokens`` each on ``context``)."""
    b = int(point["batch"])
    return costs.pass_ms(point["role"], [int(point["tokens"])] * b, [int(point.get("context", 0))] * b)


def prediction_errors(costs: RooflineCosts, points) -> dict:
    """Median and worst absolute % error of the model on measured passes."""
    errs = [abs(predict(costs, p) / p["ms"] - 1) * 100 for p in _points(points)]
    return {"n": len(errs), "median_abs_pct": statistics.median(errs), "worst_abs_pct": max(errs)}


def _coordinate_search(cost, x0, lo, hi, rounds=400):
    """Minimise ``cost`` by halving steps along each coordinate (used when scipy is not installed)."""
    x, best, step = list(x0), cost(x0), 1.0
    while step > 1e-7 and rounds > 0:
        rounds -= 1
        improved = False
        for i in range(len(x)):
            for d in (step, -step):
                y = list(x)
                y[i] = min(hi[i], max(lo[i], x[i] + d))
                value = cost(y)
                if value < best:
                    x, best, improved = y, value, True
        step = step if improved else step / 2
    return x


def fit(points, shape_target: ModelShape | None = None, shape_assistant: ModelShape | None = None, device="this",
        *, fmt: str | None = None, graphs: bool = True, devices=None) -> tuple[dict, dict]:
    """Least squares of the uncertain factors to measured passes, on log(predicted / measured) so every pass counts
    as a relative error; a faint pull towards each nominal value fixes what the points cannot tell apart (e.g.
    kernel vs host time when only target passes are given). Returns (factors, report)."""
    pts = _points(points)
    base = RooflineCosts(device, fmt, graphs, None, shape_target or TARGET_SHAPE, shape_assistant or ASSISTANT_SHAPE,
                         devices)
    x0 = [math.log(base.factors[n]) for n in UNCERTAIN_FACTORS]
    lo = [math.log(1e-3), math.log(1e-3), math.log(1e-3), math.log(1e-6)]
    hi = [math.log(1e3), math.log(1e3), math.log(1e4), math.log(1e4)]

    def residuals(x):
        costs = base.with_factors(dict(zip(UNCERTAIN_FACTORS, (math.exp(v) for v in x))))
        return [math.log(predict(costs, p) / p["ms"]) for p in pts] + [FIT_PRIOR * (a - b) for a, b in zip(x, x0)]

    try:
        from scipy.optimize import least_squares
    except ImportError:
        x, method = _coordinate_search(lambda v: sum(r * r for r in residuals(v)), x0, lo, hi), "coordinate search"
    else:
        x, method = list(least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-6).x), "scipy least_squares"
    factors = dict(zip(UNCERTAIN_FACTORS, (math.exp(v) for v in x)))
    fitted = base.with_factors(factors, calibrated=True)
    return factors, {"method": method, "label": fitted.label, "factors": factors, **prediction_errors(fitted, pts)}


def split_points(points, split: str) -> tuple[list[int], list[int]]:
    """Indices of the training and test passes of a held-out split (disjoint, both non-empty):
    ``small-to-large`` fits the passes of batch x tokens up to the median and tests the larger ones; ``context`` fits
    the smallest context and tests the others; ``target-to-assistant`` fits the target's passes, tests the
    assistant's."""
    pts = _points(points)
    if split == "small-to-large":
        median = statistics.median(p["batch"] * p["tokens"] for p in pts)
        train = [i for i, p in enumerate(pts) if p["batch"] * p["tokens"] <= median]
    elif split == "context":  # prefills (context 0) are neither fitted nor tested here: decode passes only
        first = min((p["context"] for p in pts if p["context"] > 0), default=0)
        train = [i for i, p in enumerate(pts) if p["context"] == first]
    elif split == "target-to-assistant":
        train = [i for i, p in enumerate(pts) if p["role"] == "target"]
    else:
        raise CostProfileError(f"unknown held-out split {split!r}: known splits are {', '.join(SPLITS)}")
    chosen = set(train)
    test = [i for i in range(len(pts)) if i not in chosen and not (split == "context" and pts[i]["context"] == 0)]
    if not train or not test:
        raise CostProfileError(f"held-out split {split!r} leaves {len(train)} passes to fit and {len(test)} to test")
    return train, test


def held_out_report(points, split: str, shape_target=None, shape_assistant=None, device="this", **options) -> dict:
    """Fit on one part of the measured passes, report the error on the other: median and worst absolute %."""
    pts = _points(points)
    train, test = split_points(pts, split)
    factors, report = fit([pts[i] for i in train], shape_target, shape_assistant, device, **options)
    fitted = RooflineCosts(device, options.get("fmt"), options.get("graphs", True), factors,
                           shape_target or TARGET_SHAPE, shape_assistant or ASSISTANT_SHAPE, options.get("devices"),
                           calibrated=True)
    return {"split": split, "train": train, "test": test, "factors": factors, "label": fitted.label,
            "method": report["method"], "train_median_abs_pct": report["median_abs_pct"],
            **prediction_errors(fitted, [pts[i] for i in test])}


def save_fit(factors: dict, report: dict, source: str) -> Path | None:
    return cache.write_json(fit_path(), {"factors": factors, "source": source, "cpu": machine.cpu_info(),
                                         "median_abs_pct": report.get("median_abs_pct"),
                                         "worst_abs_pct": report.get("worst_abs_pct")})


def points_from_rows(rows: list[dict], layout: str | None = None) -> list[dict]:
    """The measured passes of a batched profile CSV (``profile --batch``), one layout (default: its first): step
    passes at their context, prefills at context 0."""
    layouts = sorted({str(r.get("layout") or "") for r in rows})
    chosen = layout if layout in layouts else layouts[0]
    out = []
    for i, r in enumerate(r for r in rows if str(r.get("layout") or "") == chosen):
        try:
            point = {"role": str(r["role"]), "batch": whole_cell(r["batch"], "batch", chosen, 1),
                     "tokens": whole_cell(r["tokens"], "tokens", chosen, 1),
                     "context": 0 if r.get("kind") == "prefill" else whole_cell(r.get("context") or 0, "context", chosen),
                     "ms": float(r["ms"])}
        except (KeyError, TypeError, ValueError, OverflowError):
            raise CostProfileError(f"row {i + 1} of layout {chosen or '-'}: batch, tokens and context must be whole "
                                   f"numbers and ms a number ({dict(r)!r})") from None
        out.append(point)
    return _points(out)
