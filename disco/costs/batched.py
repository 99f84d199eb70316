"""Batched pass costs: what one forward pass over B sequences costs, as a function of each row's query tokens and
context. The batched replay (``disco.replay.batched``) prices every iteration of a continuous batch with one of these;
nothing above ``disco.costs`` knows which source it is.

A source implements ``BatchCosts``: ``target_ms(rows, contexts)`` and ``assistant_ms(rows, contexts)``, where
``rows[i]`` is the number of query tokens row ``i`` feeds in this pass (its padded length when a layout pads),
``contexts[i]`` the tokens already in its cache and ``outputs`` how many positions need logits (verification: every
draft and the next token; a draft step: one a row; None: every row). Only the roofline prices ``outputs`` (its LM
head); measured sources measured it as the engine ran. Sources:

``flat:C``        every pass costs one target step, whatever the batch (the GPU idealisation ``flat`` always meant;
                  batching is free under it, so it answers "how does the schedule change" but not "when does
                  speculation stop paying").
batch-1 curve     a measured or CSV profile without batch columns: a pass over B rows of k tokens costs what the
                  curve says for B x k tokens (one ubatch of every row's tokens, as llama.cpp's unified KV cache runs
                  it); the context is ignored, as the curve was measured at one context.
batched grid      a profile CSV with ``batch`` (and optionally ``context``, ``layout``) columns, from
                  ``python -m disco profile --batch``: interpolated in batch, tokens per row and context.
``roofline:DEV``  ``disco.costs.roofline``: a per-operation model of a named device.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from disco.costs import model as cost_model
from disco.costs import roofline
from disco.costs.model import CostModel, CostProfileError
from disco.costs.shapes import TARGET_SHAPE, ModelShape

MAX_BATCH = 1024


class BatchCosts(Protocol):
    """One source of batched pass costs (ms). ``label`` says where the figures come from (shown on every output)."""

    label: str

    def target_ms(self, rows: Sequence[int], contexts: Sequence[int], outputs: int | None = None) -> float: ...

    def assistant_ms(self, rows: Sequence[int], contexts: Sequence[int], outputs: int | None = None) -> float: ...


def check_batch(value) -> int:
    """A batch size: a whole number in 1..MAX_BATCH (one line otherwise)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CostProfileError(f"batch size {value!r} is not a whole number") from None
    if not math.isfinite(number) or number != int(number):
        raise CostProfileError(f"batch size {value!r} is not a whole number")
    if not 1 <= number <= MAX_BATCH:
        raise CostProfileError(f"batch size {int(number)} is out of range: 1 to {MAX_BATCH}")
    return int(number)


@dataclass
class FlatBatch:
    """``flat:C`` at any batch: a target pass costs ``step_ms``, an assistant pass ``c * step_ms``."""

    c: float
    step_ms: float = 100.0
    label: str = ""

    def __post_init__(self):
        self.label = self.label or f"flat:{self.c:g} (any batch costs one step)"

    def target_ms(self, rows, contexts, outputs=None) -> float:
        return self.step_ms if rows else 0.0

    def assistant_ms(self, rows, contexts, outputs=None) -> float:
        return self.c * self.step_ms if rows else 0.0


@dataclass
class TokenCurve:
    """A batch-1 cost curve read as a function of the pass's total tokens: B rows of k tokens cost what one pass of
    ``sum(rows)`` tokens costs (llama.cpp's unified KV cache runs them as one ubatch)."""

    model: CostModel
    label: str = ""

    def __post_init__(self):
        self.label = self.label or f"{self.model.meta.get('profile', 'measured')} (batch-1 curve, B x k tokens)"

    def target_ms(self, rows, contexts, outputs=None) -> float:
        n = int(sum(rows))
        return self.model.target_ms(n) if n else 0.0

    def assistant_ms(self, rows, contexts, outputs=None) -> float:
        n = int(sum(rows))
        return self.model.assistant_ms(n) if n else 0.0


def _interp(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through sorted (x, y) points, extended along the end segments beyond both ends (never < 0)."""
    if len(points) == 1:
        return points[0][1]
    i = min(max(bisect.bisect_left([p[0] for p in points], x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (x - x0) / (x1 - x0) * (y1 - y0))


@dataclass
class BatchGrid:
    """Measured batched passes, interpolated: ``cells[role][(batch, tokens, context)] = ms``.

    A pass with ragged rows is priced at its total tokens spread over its rows: the grid point (B, mean tokens per
    row) at the mean context, interpolated linearly in B, then in tokens per row, then in context. Context 0 holds
    the measured prefills (``kind`` prefill in the CSV: a prompt a row on an empty cache) and prices only passes at
    context 0; every other pass interpolates between the measured contexts above 0."""

    cells: dict[str, dict[tuple[int, int, int], float]] = field(default_factory=dict)
    label: str = "measured batched passes"

    def _ms(self, role: str, rows, contexts) -> float:
        if not rows:
            return 0.0
        table = self.cells.get(role) or {}
        if not table:
            raise CostProfileError(f"the batched profile has no {role} rows")
        b = len(rows)
        k = sum(rows) / b
        ctx = sum(contexts) / len(contexts) if contexts else 0.0
        by_ctx: dict[int, list[tuple[float, float]]] = {}
        measured = sorted({c for (_, _, c) in table})
        if len(measured) > 1:  # context 0 holds prefills (a whole prompt a row): only a pass at context 0 reads them
            measured = [0] if ctx == 0 and measured[0] == 0 else [c for c in measured if c > 0]
        for context in measured:
            by_batch = []
            for batch in sorted({bb for (bb, _, c) in table if c == context}):
                pts = sorted((float(t), ms) for (bb, t, c), ms in table.items() if bb == batch and c == context)
                by_batch.append((float(batch), _interp(pts, k)))
            by_ctx[context] = by_batch
        pts = sorted((float(c), _interp(v, float(b))) for c, v in by_ctx.items())
        return _interp(pts, ctx)

    def target_ms(self, rows, contexts, outputs=None) -> float:
        return self._ms("target", rows, contexts)

    def assistant_ms(self, rows, contexts, outputs=None) -> float:
        return self._ms("assistant", rows, contexts)


def context_note(costs: BatchCosts, contexts: Sequence[int]) -> str | None:
    """What a cost source says about passes at ``contexts`` cached tokens, where it is less than a model of them:
    None for a roofline (it prices every context) and for a grid measured that far."""
    costs = getattr(costs, "costs", costs)  # a HeadDrafter prices what its source prices
    if isinstance(costs, (FlatBatch, TokenCurve)):
        return f"{costs.label} prices no context: every cached context costs alike under it"
    if isinstance(costs, BatchGrid):
        measured = max((c for table in costs.cells.values() for (_, _, c) in table), default=0)
        if max(contexts, default=0) > measured:
            return (f"the measured grid reaches {measured} cached tokens: beyond it passes are extrapolated linearly in "
                    "context (measure longer ones with profile --batch --contexts)")
    return None


# ---------------------------------------------------------------------------------------------
# reading a batched profile and resolving a profile name to a batched cost source

BATCH_COLUMNS = ("batch", "context", "layout")


def grid_from_rows(rows: list[dict], source: str, layout: str | None = None) -> BatchGrid | None:
    """The batched grid of a profile's rows (step passes only), or None when the rows have no ``batch`` column (a
    batch-1 profile). ``layout`` picks one measured layout where the rows hold several (default: the first)."""
    if not rows or "batch" not in rows[0]:
        return None
    layouts = sorted({str(r.get("layout") or "") for r in rows})
    chosen = layout if layout in layouts else layouts[0]
    cells: dict[str, dict[tuple[int, int, int], float]] = {}
    for r in rows:
        if str(r.get("layout") or "") != chosen:
            continue
        batch = check_batch(cost_model.whole_cell(r["batch"], "batch", source, 1))
        context = 0 if str(r.get("kind")) == "prefill" else cost_model.whole_cell(r.get("context") or 0, "context", source)
        tokens = cost_model.whole_cell(r["tokens"], "tokens", source, 1)
        try:
            ms = float(r["ms"])
        except (TypeError, ValueError):
            ms = math.nan
        if not (math.isfinite(ms) and ms > 0):
            raise CostProfileError(f"{source}: ms must be a positive number, got {r['ms']!r}")
        cells.setdefault(str(r["role"]), {})[(batch, tokens, context)] = ms
    if "target" not in cells or "assistant" not in cells:
        raise CostProfileError(f"{source}: a batched profile needs target and assistant step rows")
    label = f"measured batched passes ({source}{', layout ' + chosen if chosen else ''})"
    return BatchGrid(cells, label)


def resolve_batched(name: str, measured: CostModel | None = None, step_ms: float | None = None) -> BatchCosts:
    """The batched cost source of a canonical profile name (``disco.costs.model.check_profile``): ``flat:C``, a CSV
    (a batched grid when it has a ``batch`` column, else its batch-1 curve), ``roofline:DEVICE[:FORMAT]``, or
    ``measured`` (``measured``: this machine's batch-1 CostModel, read as a token curve)."""
    if name.startswith("roofline:"):
        return roofline.roofline_costs(name)
    if name.startswith("flat:"):
        return FlatBatch(float(name.split(":", 1)[1]), step_ms or cost_model.NOMINAL_STEP_MS)
    if name == cost_model.MEASURED:
        if measured is None:
            raise CostProfileError("the measured cost profile needs this machine's costs (run `python -m disco "
                                   "profile`, or give --cost-profile flat:C, roofline:DEVICE or a CSV)")
        return TokenCurve(measured)
    rows = cost_model.csv_rows(name)
    grid = grid_from_rows(rows, name)
    return grid if grid is not None else TokenCurve(cost_model.read_csv(name))


# ---------------------------------------------------------------------------------------------
# a drafter that costs one target layer per token (EAGLE / MTP heads), as a what-if

DRAFTERS = ("assistant", "head")
HEAD_NOTE = ("drafter: one target layer and the LM head per token (an EAGLE/MTP-like head; a what-if: acceptance is "
             "the assistant's)")


def head_share(shape: ModelShape = TARGET_SHAPE) -> float:
    """A one-layer head's share of the target's pass, by weights read (a pass on a CPU reads every weight once): one
    decoder layer plus the LM head it shares with the target, over the target's weights (0.18 for the embedded
    target: its LM head alone is about five layers)."""
    head = shape.vocab * shape.hidden
    layer = (shape.params - head * (1 if shape.tied_embeddings else 2)) / shape.layers
    return (layer + head) / shape.params


@dataclass
class HeadDrafter:
    """``costs`` with the assistant's passes replaced by a head that costs one target layer and the LM head per token:
    the target's pass over the same rows times ``head_share`` (on a roofline: a one-layer copy of the target's shape,
    ``with_drafter``)."""

    costs: BatchCosts
    share: float = field(default_factory=head_share)
    label: str = ""

    def __post_init__(self):
        self.label = self.label or f"{self.costs.label}; {HEAD_NOTE}"

    def target_ms(self, rows, contexts, outputs=None) -> float:
        return self.costs.target_ms(rows, contexts, outputs)

    def assistant_ms(self, rows, contexts, outputs=None) -> float:
        return self.costs.target_ms(rows, contexts, outputs) * self.share if rows else 0.0


def with_drafter(costs: BatchCosts, drafter: str) -> BatchCosts:
    """``costs`` drafting with ``drafter``: the pair's assistant (unchanged) or a one-layer head (``HeadDrafter``)."""
    if drafter == "assistant":
        return costs
    if drafter != "head":
        raise CostProfileError(f"unknown drafter {drafter!r}: expected {' or '.join(DRAFTERS)}")
    if isinstance(costs, roofline.RooflineCosts):
        head = dataclasses.replace(costs.target_shape, layers=1)
        return dataclasses.replace(costs, assistant_shape=head, label=f"{costs.label}; {HEAD_NOTE}")
    return HeadDrafter(costs)
