"""Per-pass costs: what one target pass and one assistant pass cost as a function of the tokens fed.

Replay (``disco.replay``) is exact about *what* happens (iterations, drafts, acceptances, passes); the
cost model turns those passes into time. Three cost profiles, chosen with ``--cost-profile`` on the
benchmark and the Sweep tab's menu:

``measured``
    this machine, timed the way the engine calls the models (``calibrate``), cached per pair.
``flat:C``
    verifying any number of tokens costs one target step and an assistant step costs ``C`` target
    steps, prefills included: the regime of a GPU with a tiny draft, where Leviathan et al.'s
    closed form holds exactly (time = target passes + C x assistant passes, in target steps).
a CSV path
    per-pass costs measured elsewhere (``python -m disco profile --csv``): columns role, precision,
    kind (step | prefill), tokens, ms.

A profile only changes time estimates, never the replayed iterations (except for the one policy that reads
it, ``costaware``), so any profile can be applied to cached replay tables without loading the models.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch

MEASURED = "measured"
PRESETS = (MEASURED, "flat:0.05", "flat:0.1", "flat:0.2", "flat:0.4")
FLAT_C_MAX = 10.0
NOMINAL_STEP_MS = 100.0  # a flat profile's target step when nothing was measured (speed-ups do not depend on it)
CSV_COLUMNS = ["role", "precision", "kind", "tokens", "ms"]


class CostProfileError(ValueError):
    """A cost profile that cannot be parsed or read (one line for the user)."""


def _interp(points: list[tuple[int, float]], n: float) -> float:
    """Piecewise-linear interpolation over (n, ms) points; linear extrapolation beyond the ends."""
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


@dataclass
class CostModel:
    """Measured cost (ms) of one forward pass of each model as a function of the tokens fed to it.

    Small n are verification / drafting passes on top of a cache; large n are prefills. The engine
    feeds the target ``1 + drafts`` tokens per iteration (``prompt + drafts`` on iteration 1) and
    the assistant 1-2 tokens per draft step (the whole prompt on iteration 1).
    """

    target: list[tuple[int, float]]
    assistant: list[tuple[int, float]]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.target = sorted((int(n), float(ms)) for n, ms in self.target)
        self.assistant = sorted((int(n), float(ms)) for n, ms in self.assistant)

    def target_ms(self, n: int) -> float:
        return _interp(self.target, n)

    def assistant_ms(self, n: int) -> float:
        return _interp(self.assistant, n)

    @property
    def cost_ratio(self) -> float:
        """c = t_draft / t_target for one token (Leviathan et al.)."""
        return self.assistant_ms(1) / self.target_ms(1)

    def to_dict(self) -> dict:
        return {"target": self.target, "assistant": self.assistant, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls([tuple(x) for x in data["target"]], [tuple(x) for x in data["assistant"]], dict(data.get("meta", {})))


def _crop(cache, length: int) -> None:
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@torch.inference_mode()
def calibrate(pair, context_ids: list[int], prefill_lengths: Iterable[int] = (), verify_sizes: Iterable[int] | None = None,
              assistant_sizes: Iterable[int] = (1, 2, 3), reps: int = 3, kmax: int = 20) -> CostModel:
    """Measure per-pass costs on this machine, the way the engine calls the models.

    ``context_ids``: a realistic prompt (the cache length verification runs on top of). Each size is
    timed ``reps`` times, interleaving the two models and all sizes so drift hits them alike; the
    median is kept. Prefill sizes are timed on a fresh cache.
    """
    from transformers import DynamicCache

    if verify_sizes is None:
        verify_sizes = sorted({1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 17, kmax + 1})
    pair.warmup()
    device = pair.device
    ctx = list(context_ids) or [pair.eos_ids[0]]
    filler = ctx[-1]
    caches = {}
    for role, model in (("target", pair.target), ("assistant", pair.assistant)):
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ctx], device=device), cache=cache, use_cache=True, logits_to_keep=1)
        caches[role] = (model, cache, len(ctx))
    jobs = [("target", n, False) for n in verify_sizes] + [("assistant", n, False) for n in assistant_sizes]
    for n in sorted(set(int(x) for x in prefill_lengths if int(x) > max(verify_sizes))):
        jobs += [("target", n, True), ("assistant", n, True)]
    samples: dict[tuple, list[float]] = {job: [] for job in jobs}
    for _ in range(reps):
        for job in jobs:
            role, n, fresh = job
            model, cache, base = caches[role]
            tokens = (ctx * (n // len(ctx) + 1))[:n] if fresh else [filler] * n
            x = torch.tensor([tokens], device=device)
            use = DynamicCache(config=model.config) if fresh else cache
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            out = model(input_ids=x, cache=use, use_cache=True, logits_to_keep=1 if fresh else n)
            out.logits[0, -1:].float().argmax()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples[job].append((time.perf_counter() - start) * 1000.0)
            if not fresh:
                _crop(cache, base)
    target = [(n, statistics.median(samples[("target", n, f)])) for (r, n, f) in jobs if r == "target"]
    assistant = [(n, statistics.median(samples[("assistant", n, f)])) for (r, n, f) in jobs if r == "assistant"]
    meta = dict(pair.describe())
    meta.update(context_tokens=len(ctx), reps=reps, threads=torch.get_num_threads(),
                measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    return CostModel(target, assistant, meta)


# ---------------------------------------------------------------------------------------------
# cost profiles


def _flat_c(text: str) -> float:
    body = text.split(":", 1)[1].strip()
    try:
        c = float(body)
    except ValueError:
        raise CostProfileError(f"cost profile {text!r}: C must be a number, as in flat:0.05") from None
    if not (math.isfinite(c) and 0 <= c <= FLAT_C_MAX):
        raise CostProfileError(f"cost profile {text!r}: C must be in [0, {FLAT_C_MAX:g}] target steps")
    return c


def check_profile(text: str | None) -> str:
    """The profile's canonical name (``measured``, ``flat:C`` or a CSV path); raises CostProfileError."""
    text = (str(text).strip() if text is not None else "") or MEASURED
    if text == MEASURED:
        return text
    if text.startswith("flat:"):
        return f"flat:{_flat_c(text):g}"
    path = Path(text)
    if path.suffix.lower() != ".csv":
        raise CostProfileError(f"unknown cost profile {text!r}: expected measured, flat:C (e.g. flat:0.05) or a .csv "
                               "file from `python -m disco profile --csv`")
    if not path.is_file():
        raise CostProfileError(f"cost profile {text!r}: no such file")
    return str(path)


def flat(c: float, step_ms: float = NOMINAL_STEP_MS) -> CostModel:
    """Every target pass costs ``step_ms``, every assistant pass ``c * step_ms``, whatever it is fed."""
    step = float(step_ms) if step_ms and math.isfinite(step_ms) and step_ms > 0 else NOMINAL_STEP_MS
    return CostModel([(1, step), (2, step)], [(1, c * step), (2, c * step)],
                     {"profile": f"flat:{c:g}", "step_ms": step, "cost_ratio": c})


def from_rows(rows: Iterable[dict], precision: str | None = None, source: str = "rows") -> CostModel:
    """A cost model from per-pass rows (``profile.Profile.cost_rows`` / its CSV) for one assistant precision.

    ``precision`` None, or absent from the rows while they hold a single assistant precision, takes that one."""
    target, assistant = {}, {}
    for row in rows:
        try:
            role, p, n, ms = str(row["role"]), str(row["precision"]), int(row["tokens"]), float(row["ms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CostProfileError(f"{source}: a row is not role,precision,kind,tokens,ms ({exc})") from None
        if n < 1 or not (math.isfinite(ms) and ms > 0):
            raise CostProfileError(f"{source}: tokens must be >= 1 and ms > 0 (got {n}, {ms})")
        if role == "target":
            target[n] = ms
        elif role == "assistant":
            assistant.setdefault(p, {})[n] = ms
        else:
            raise CostProfileError(f"{source}: role must be target or assistant, got {role!r}")
    if not target or not assistant:
        raise CostProfileError(f"{source}: needs target and assistant rows")
    if precision not in assistant:
        if len(assistant) != 1 and precision is not None:
            raise CostProfileError(f"{source}: no assistant rows for precision {precision!r} "
                                   f"(it has {', '.join(sorted(assistant))})")
        if len(assistant) != 1:
            raise CostProfileError(f"{source}: several assistant precisions ({', '.join(sorted(assistant))}); "
                                   "choose one with --assistant-precision")
        precision = next(iter(assistant))
    return CostModel(sorted(target.items()), sorted(assistant[precision].items()),
                     {"profile": source, "assistant_precision": precision})


def read_csv(path: str | Path, precision: str | None = None) -> CostModel:
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise CostProfileError(f"cost profile {str(path)!r} could not be read: {exc}") from None
    missing = [c for c in CSV_COLUMNS if c not in frame.columns]
    if missing:
        raise CostProfileError(f"cost profile {str(path)!r} lacks column(s) {', '.join(missing)}")
    return from_rows(frame.to_dict("records"), precision, source=str(path))


def write_csv(rows: Iterable[dict], path: str | Path) -> None:
    import pandas as pd

    pd.DataFrame(list(rows), columns=CSV_COLUMNS).to_csv(path, index=False)


def resolve(profile: str | None, measured=None, precision: str | None = None, step_ms: float | None = None) -> CostModel:
    """The cost model of a profile. ``measured``: a CostModel or a no-argument callable giving one (only called
    for ``measured``); ``step_ms``: the target step a flat profile is expressed in (the measured one if known)."""
    name = check_profile(profile)
    if name == MEASURED:
        model = measured() if callable(measured) else measured
        if model is None:
            raise CostProfileError("the measured cost profile needs the models (or an earlier run's costs)")
        return model
    if name.startswith("flat:"):
        return flat(_flat_c(name), step_ms or NOMINAL_STEP_MS)
    return read_csv(name, precision)


# ---------------------------------------------------------------------------------------------
# measured costs for the benchmark and the app


def suite_costs(pair, prompt_ids_list: list[list[int]], kmax: int, reps: int = 2) -> CostModel:
    """Calibrate on a suite: verification sizes 1..kmax+1 on a median-length prompt, prefills of a
    median and of the longest prompt (+ a full draft), the sizes iteration 1 feeds the target."""
    lengths = sorted(len(ids) for ids in prompt_ids_list)
    context = prompt_ids_list[[len(i) for i in prompt_ids_list].index(lengths[len(lengths) // 2])]
    prefill = {lengths[len(lengths) // 2], lengths[-1] + kmax + 1}
    return calibrate(pair, context, prefill_lengths=prefill, reps=reps, kmax=kmax)


_COSTS: dict[int, CostModel] = {}


def _costs_path(pair, cache_dir: Path | None) -> Path | None:
    from disco.replay import table_key

    return Path(cache_dir) / f"costs-{table_key(pair, [0])}.json" if cache_dir else None


def known_costs(pair, cache_dir: Path | None = None) -> CostModel | None:
    """This pair's measured costs if they were measured already (this session or an earlier one), else None;
    never measures."""
    if id(pair) in _COSTS:
        return _COSTS[id(pair)]
    path = _costs_path(pair, cache_dir)
    if path is not None and path.is_file():
        try:
            _COSTS[id(pair)] = CostModel.from_dict(json.loads(path.read_text()))
            return _COSTS[id(pair)]
        except (ValueError, KeyError, TypeError):
            return None
    return None


def cached_costs(pair, prompt_ids_list: list[list[int]], kmax: int = 20, cache_dir: Path | None = None,
                 reps: int = 2) -> CostModel:
    """Per-pass costs for the app: measured once per pair and kept (in memory and next to the tables)."""
    known = known_costs(pair, cache_dir)
    if known is not None:
        return known
    path = _costs_path(pair, cache_dir)
    costs = suite_costs(pair, prompt_ids_list, max(kmax, 20), reps=reps)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(costs.to_dict()))
    _COSTS[id(pair)] = costs
    return costs
