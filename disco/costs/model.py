"""Per-pass costs: what one target pass and one assistant pass cost as a function of the tokens fed.

Replay (``disco.replay``) is exact about *what* happens (iterations, drafts, acceptances, passes); the
cost model turns those passes into time. Three cost profiles, chosen with ``--cost-profile`` on the
benchmark and the Sweep tab's menu:

``measured``
    this machine, timed the way the engine calls the models (``disco.costs.measure``), cached per pair.
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

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from disco.costs import roofline
from disco.costs.errors import CostProfileError
from disco.errors import first_line
from disco.models.timing import interpolate

MEASURED = "measured"
PRESETS = (MEASURED, "flat:0.05", "flat:0.1", "flat:0.2", "flat:0.4")
FLAT_C_MAX = 10.0
NOMINAL_STEP_MS = 100.0  # a flat profile's target step when nothing was measured (speed-ups do not depend on it)
CSV_COLUMNS = ["role", "precision", "kind", "tokens", "ms"]


QUIET_TOLERANCE = 0.10  # a run whose own clock is this far off its records' quiet cost ran on a busy (or changed) machine


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
        return interpolate(self.target, n)

    def assistant_ms(self, n: int) -> float:
        return interpolate(self.assistant, n)

    def iteration_ms(self, target_tokens: int, draft_calls: int, assistant_tokens: int) -> float:
        """What one iteration's passes cost, from its record's counts: one target pass over ``target_tokens``, and
        ``draft_calls`` assistant passes fed ``assistant_tokens`` in all (the first catches up on what the assistant
        has not seen, each other feeds one token): what replay charges, so a live run's records are costed exactly
        as replay would cost them."""
        ms = self.target_ms(target_tokens)
        if draft_calls:
            ms += self.assistant_ms(assistant_tokens - (draft_calls - 1)) + (draft_calls - 1) * self.assistant_ms(1)
        return ms

    def records_ms(self, records) -> float:
        """What a run's iterations cost under this model: its own records (pass sizes), costed as replay costs them.
        Beside a live run's clock, it says whether the machine ran the passes at its measured, quiet speed."""
        return sum(self.iteration_ms(r.target_tokens, r.draft_calls, r.assistant_tokens) for r in records)

    def lane_ms(self, records, precision: str | None) -> float:
        """``records_ms`` of one lane, or NaN when the lane drafted with an assistant (``precision``) other than the
        one these costs measured (its steps would be costed at another assistant's price)."""
        measured = (self.meta or {}).get("assistant_precision")
        if measured and precision != measured and any(r.draft_calls for r in records):
            return math.nan
        return self.records_ms(records)

    @property
    def cost_ratio(self) -> float:
        """c = t_draft / t_target for one token (Leviathan et al.)."""
        return self.assistant_ms(1) / self.target_ms(1)

    def to_dict(self) -> dict:
        return {"target": self.target, "assistant": self.assistant, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls([tuple(x) for x in data["target"]], [tuple(x) for x in data["assistant"]], dict(data.get("meta", {})))


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
    if text.startswith("roofline:"):
        return roofline.check_roofline(text)
    path = Path(text)
    if path.suffix.lower() != ".csv":
        raise CostProfileError(f"unknown cost profile {text!r}: expected measured, flat:C (e.g. flat:0.05), "
                               "roofline:DEVICE (e.g. roofline:h100) or a .csv file from `python -m disco profile --csv`")
    if not path.is_file():
        raise CostProfileError(f"cost profile {text!r}: no such file")
    parse_rows(batch_one(csv_rows(path), str(path)), str(path))  # checked now, before any model is loaded
    return str(path)


def flat(c: float, step_ms: float = NOMINAL_STEP_MS) -> CostModel:
    """Every target pass costs ``step_ms``, every assistant pass ``c * step_ms``, whatever it is fed."""
    step = float(step_ms) if step_ms and math.isfinite(step_ms) and step_ms > 0 else NOMINAL_STEP_MS
    return CostModel([(1, step), (2, step)], [(1, c * step), (2, c * step)],
                     {"profile": f"flat:{c:g}", "step_ms": step, "cost_ratio": c})


MAX_TOKENS = 1 << 20  # no pass is fed more tokens than this; a larger count in a CSV is a mistake


def _whole(value) -> int:
    """A token count from a CSV cell: a whole number in 1..MAX_TOKENS (``inf``, ``1e400`` and ``2.5`` are refused)."""
    number = float(value)
    if not math.isfinite(number) or number != int(number) or not 1 <= number <= MAX_TOKENS:
        raise ValueError(f"tokens must be a whole number from 1 to {MAX_TOKENS}, got {value!r}")
    return int(number)


def parse_rows(rows: Iterable[dict], source: str = "rows") -> tuple[dict[int, float], dict[str, dict[int, float]]]:
    """(target ms by tokens, assistant ms by precision and tokens) of per-pass rows; one line for any bad row."""
    target, assistant = {}, {}
    for row in rows:
        try:
            role, p, n, ms = str(row["role"]), str(row["precision"]), _whole(row["tokens"]), float(row["ms"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CostProfileError(f"{source}: a row is not role,precision,kind,tokens,ms ({exc})") from None
        if not (math.isfinite(ms) and ms > 0):
            raise CostProfileError(f"{source}: tokens must be >= 1 and ms > 0 (got {n}, {ms})")
        if role == "target":
            target[n] = ms
        elif role == "assistant":
            assistant.setdefault(p, {})[n] = ms
        else:
            raise CostProfileError(f"{source}: role must be target or assistant, got {role!r}")
    if not target or not assistant:
        raise CostProfileError(f"{source}: needs target and assistant rows")
    return target, assistant


def from_rows(rows: Iterable[dict], precision: str | None = None, source: str = "rows") -> CostModel:
    """A cost model from per-pass rows (``profile.Profile.cost_rows`` / its CSV) for one assistant precision.

    ``precision`` None, or absent from the rows while they hold a single assistant precision, takes that one."""
    target, assistant = parse_rows(rows, source)
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


CSV_MAX_BYTES = 1 << 20   # a profile from `profile --csv` is a few KB; a bigger upload is refused before it is parsed
CSV_MAX_ROWS = 10_000


def csv_rows(path: str | Path) -> list[dict]:
    """The rows of a per-pass cost CSV, read with bounds (size, rows, columns); one line for anything unreadable."""
    import pandas as pd

    try:
        size = Path(path).stat().st_size
    except OSError as exc:
        raise CostProfileError(f"cost profile {str(path)!r} could not be read: {exc.strerror or exc}") from None
    if size > CSV_MAX_BYTES:
        raise CostProfileError(f"cost profile {Path(path).name!r} is {size:,} bytes; a per-pass cost CSV is at most "
                               f"{CSV_MAX_BYTES:,}")
    try:
        frame = pd.read_csv(path, nrows=CSV_MAX_ROWS + 1, dtype=str, keep_default_na=False, encoding="utf-8")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CostProfileError(f"cost profile {str(path)!r} could not be read: {first_line(exc)}") from None
    if len(frame) > CSV_MAX_ROWS:
        raise CostProfileError(f"cost profile {Path(path).name!r} has more than {CSV_MAX_ROWS:,} rows")
    missing = [c for c in CSV_COLUMNS if c not in frame.columns]
    if missing:
        raise CostProfileError(f"cost profile {str(path)!r} lacks column(s) {', '.join(missing)}")
    return frame.to_dict("records")


def whole_cell(value, column: str, source: str, lo: int = 0) -> int:
    """A profile CSV cell that must be a whole number >= ``lo`` (batch, tokens, context); one line otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number) or number < lo:
        raise CostProfileError(f"{source}: column {column} must hold whole numbers >= {lo}, got {value!r}")
    return int(number)


def batch_one(rows: list[dict], source: str) -> list[dict]:
    """The batch-1 passes of a profile's rows: all of them when the CSV has no ``batch`` column (a batch-1 profile);
    else those at batch 1, at its smallest measured context and its first layout. A batch that is not a whole number
    >= 1 is refused in one line."""
    if not rows or "batch" not in rows[0]:
        return rows
    batches = [whole_cell(r["batch"], "batch", source, 1) for r in rows]
    kept = [r for r, b in zip(rows, batches) if b == 1 and str(r.get("kind", "step")) != "prefill"]
    if kept and "context" in kept[0]:
        contexts = [_context(r.get("context"), source) for r in kept]
        low = min(contexts)
        kept = [r for r, c in zip(kept, contexts) if c == low]
    if kept and "layout" in kept[0]:
        first = sorted(str(r["layout"]) for r in kept)[0]
        kept = [r for r in kept if str(r["layout"]) == first]
    return kept


def roofline_model(costs, context: int = 512) -> CostModel:
    """A device's roofline (``disco.costs.roofline``) as a batch-1 CostModel: one row of n tokens on ``context`` cached
    ones, for every batch-1 path (the Race, the Sweep, bench without --batch)."""
    return CostModel([(n, costs.target_ms([n], [context])) for n in roofline.BATCH1_TOKENS],
                     [(n, costs.assistant_ms([n], [context])) for n in roofline.BATCH1_TOKENS],
                     {"profile": costs.profile, "label": costs.label, "context": context})


def _context(value, source: str) -> float:
    try:
        number = float(value or 0)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number >= 0):
        raise CostProfileError(f"{source}: column context must hold whole numbers >= 0, got {value!r}")
    return number


def read_csv(path: str | Path, precision: str | None = None) -> CostModel:
    return from_rows(batch_one(csv_rows(path), str(path)), precision, source=str(path))


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
    if name.startswith("roofline:"):
        return roofline_model(roofline.roofline_costs(name))
    return read_csv(name, precision)
