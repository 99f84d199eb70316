"""Batched replay: B sequences decoded together under continuous batching, from the batch-1 replay tables.

With batch-invariant kernels (exact llama.cpp kernels on a CPU; vLLM's batch-invariant or SGLang's deterministic mode
on a GPU) greedy acceptance does not depend on the batch, so what each sequence drafts, accepts and emits is already
in its table: the batched replay only schedules the sequences together and prices each batch iteration
(``disco.replay.layouts``) with a batched cost source (``disco.costs.batched``).

The loop (one batch iteration at a time, on a modelled clock):
  * admission: a free slot takes the next request whose arrival time has come (fixed concurrency: every request is
    there at 0, so a finished sequence's slot takes the next one at once; open loop: Poisson arrivals at a rate);
    a new sequence's first iteration carries its prompt (its prefill, the assistant's too), as in batch-1 replay;
  * every active sequence runs one iteration of its own policy (``disco.replay.run.ReplayRun``): per-sequence rules
    keep their own state, kinds that engines keep once per batch (``Policy.batch_shared``: SGLang's depth, the
    bandit) share one instance, and policies that read costs see the batch's costs at this batch size;
  * the iteration costs its drafting (as deep as its deepest drafter, every step over all drafting rows) plus its
    verification in the chosen layout; every sequence's new tokens are emitted at the iteration's end.

A setting ``free:SPEC`` lets the rows of a per-sequence rule draft to the batch's depth (``disco.replay.free_draft``).
A setting ``batchstop:KMAX`` is the batch-level stop rule: before each iteration it chooses one depth D for the whole
batch, the one that maximises expected tokens per ms, where each row's expected tokens at depth D are
1 + sum_{j<=D} prod_{m<=j} p_m over its assistant's chain confidences p (the confidence taken as the acceptance
estimate) and the time is the batch's drafting and verification at D (ragged). Drafting stops when one more step
would add less, summed over the batch, than it costs.

Figures are read in a steady-state window (``window``): with fixed concurrency from the first completion (the initial
lockstep prefill is behind) to the last admission (the batch is full throughout); with arrivals from the 10th
percentile arrival to the last. TTFT counts from arrival with arrivals, from admission to a slot with fixed
concurrency (every request is there at 0 and waits for a slot by design). At B = 1, every request in turn and the whole
run as the window, the batched replay is today's replay: the same records and modelled time (tests/unit/test_batched.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from disco.costs.batched import BatchCosts
from disco.costs.model import CostModel
from disco.errors import InputError
from disco.policies import Policy, parse_strategy
from disco.replay import free_draft
from disco.replay.layouts import Pricer, RowPass
from disco.replay.run import ReplayRun
from disco.replay.tables import ChainEnded, ChainMissing, ReplayTable

BATCH_STOP = "batchstop"
VIEW_TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256, 512, 1024, 2048)


class BatchReplayError(InputError):
    """A batched replay that cannot run as asked (a bad rate, an empty stream, an unknown setting)."""


@dataclass(frozen=True)
class Request:
    index: int
    table: ReplayTable
    arrival_ms: float = 0.0


def request_stream(tables: Sequence[ReplayTable], count: int, seed: int, rate_per_s: float | None = None) -> list[Request]:
    """``count`` requests drawn with replacement from ``tables`` (seeded), all there at 0 (fixed concurrency) or
    arriving as a Poisson process at ``rate_per_s``."""
    if not tables:
        raise BatchReplayError("no replay tables to draw requests from")
    if count < 1:
        raise BatchReplayError(f"the request stream needs at least one request, got {count}")
    if rate_per_s is not None and not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise BatchReplayError(f"arrival rate must be > 0 requests/s, got {rate_per_s}")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(tables), size=count)
    if rate_per_s is None:
        arrivals = np.zeros(count)
    else:
        arrivals = np.cumsum(rng.exponential(1000.0 / rate_per_s, size=count))
    return [Request(i, tables[int(p)], float(a)) for i, (p, a) in enumerate(zip(picks, arrivals))]


def batch_view(costs: BatchCosts, batch: int, context: int) -> CostModel:
    """The batch's costs as a batch-1 ``CostModel`` a policy can read: a pass of n tokens a row over ``batch`` rows
    (what ``costaware`` weighs: one more draft step and one more verified token, for the whole batch)."""
    ctx = [context] * batch
    return CostModel([(n, costs.target_ms([n] * batch, ctx)) for n in VIEW_TOKENS],
                     [(n, costs.assistant_ms([n] * batch, ctx)) for n in VIEW_TOKENS],
                     {"profile": f"{costs.label} at batch {batch}"})


class Setting:
    """What every sequence of a batched replay runs: a policy spec, or ``batchstop:KMAX``."""

    def __init__(self, spec: str):
        self.spec = str(spec).strip()
        self.free = False
        self.batch_stop = self.spec.startswith(BATCH_STOP + ":") or self.spec == BATCH_STOP
        if self.batch_stop:
            tail = self.spec.partition(":")[2] or "20"
            try:
                self.kmax = int(tail)
            except ValueError:
                raise BatchReplayError(f"{self.spec!r}: expected batchstop:KMAX with a whole KMAX") from None
            if not 1 <= self.kmax <= 64:
                raise BatchReplayError(f"{self.spec!r}: KMAX must be in 1..64")
            self.spec = f"{BATCH_STOP}:{self.kmax}"
            self.shared = False
            probe = parse_strategy(f"static:{self.kmax}")  # its depth is set before each iteration (``_depth``)
        else:
            self.free = self.spec.startswith(free_draft.PREFIX + ":")  # disco.replay.free_draft
            probe = parse_strategy(self.spec.partition(":")[2] if self.free else self.spec)
            if probe.probes_verification:
                raise BatchReplayError(f"{self.spec!r}: the oracle has no batched meaning")
            if self.free and (type(probe).batch_shared or not probe.uses_assistant or probe.proposes):
                raise BatchReplayError(f"{self.spec!r}: free: takes a per-sequence rule that drafts with the assistant")
            self.spec = f"{free_draft.PREFIX}:{probe.spec}" if self.free else probe.spec
            self.shared = type(probe).batch_shared
        self.rule = probe.spec  # what each sequence runs (free: its rows then draft to the batch's depth)
        self.reads_costs = bool(probe.needs_costs or probe.reads_costs)  # else its runs need no cost model
        self._shared: Policy | None = None
        # its iterations are the same whatever the batch, layout and costs: replayed once per request's table
        self.cacheable = not (self.batch_stop or self.shared or self.free or self.reads_costs)

    def policy(self) -> Policy:
        if self.shared:
            if self._shared is None:
                self._shared = parse_strategy(self.rule)
            return self._shared
        return parse_strategy(self.rule)

    def fresh(self) -> "Setting":
        return Setting(self.spec)


class _Slot:
    """One admitted request: its replay run (or its cached iterations) and what it has emitted when."""

    def __init__(self, request: Request, setting: Setting, view: CostModel, max_new_tokens: int, bind: bool,
                 traces: dict | None = None, slot: int = 0, admitted_ms: float = 0.0):
        self.request = request
        self.slot = slot                # its place in the batch (llama.cpp's sequence id)
        self.admitted_ms = admitted_ms  # when it took its slot (closed-loop TTFT counts from here)
        self.first_ms = math.nan
        self.emissions: list[tuple[float, int]] = []
        if traces is not None and setting.cacheable:
            self.run, (self._steps, self._output) = None, trace(request.table, setting, max_new_tokens, traces)
            self._next = 0
        else:
            costs = view if setting.reads_costs else None  # reading none, it needs none: the batch prices its passes
            self.run = ReplayRun(request.table, setting.policy(), max_new_tokens, costs, bind=bind)

    @property
    def done(self) -> bool:
        return self.run.done if self.run is not None else self._next >= len(self._steps)

    @property
    def output_ids(self) -> list[int]:
        return list(self.run.output_ids) if self.run is not None else self._output

    def step(self, depth: int | None = None) -> tuple[RowPass, int]:
        """One iteration; ``depth``: draft to the batch's depth (``free:``, disco.replay.free_draft)."""
        if self.run is not None:
            row, emitted = _row_of(self.run, depth)
        else:
            self._next += 1
            row, emitted = self._steps[self._next - 1]
        return row.at(self.slot), emitted


def trace(table, setting: Setting, max_new_tokens: int, traces: dict) -> tuple[list, list[int]]:
    """A per-sequence rule that reads no costs (``Setting.cacheable``) on one table: its iterations as batch rows and
    its output, the same at every B, layout and seed, so replayed once and kept in ``traces``."""
    key = (id(table), setting.spec, max_new_tokens)
    if key not in traces:
        run = ReplayRun(table, setting.policy(), max_new_tokens)
        steps = []
        while not run.done:
            steps.append(_row_of(run))
        traces[key] = (steps, list(run.output_ids))
    return traces[key]


def _row_of(run: ReplayRun, depth: int | None = None) -> tuple[RowPass, int]:
    """One iteration of ``run`` as its share of a batch iteration, and the tokens it emitted."""
    core = run.core
    t_ctx, a_ctx, new = core.t_len, core.a_len, core.out_len == 0 and not core.records
    # free: the row's KMAX (what padded-k pads to) is its rule's as the iteration starts, not the depth drafted to
    kmax = None if depth is None else (core.budgets()[0] if run.policy.drafts else 0)
    record = run.step() if depth is None else free_draft.step_to_depth(run, depth)
    first_fed = record.assistant_tokens - (record.draft_calls - 1) if record.draft_calls else 0
    kmax = int(record.max_lookahead) if kmax is None else kmax
    return RowPass(record.target_tokens, kmax, record.draft_calls, first_fed, t_ctx, a_ctx, new, record.lookahead + 1), \
        record.emitted


@dataclass
class BatchRun:
    """One batched replay's log: per batch iteration (end ms, rows, tokens emitted, draft ms, verify ms, tokens sent to
    the target, draft passes) and per finished request (arrival, admission, first token, finish, tokens, emissions)."""

    iterations: list[tuple[float, int, int, float, float]] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    last_admission_ms: float = 0.0
    first_finish_ms: float = math.nan
    output: dict[int, list[int]] = field(default_factory=dict)
    cut: int = 0  # free: rows whose draft a cached table's chain ended (disco.replay.free_draft)


def _depth(slots: list[_Slot], kmax: int, pricer: Pricer) -> list[int]:
    """The batch-level stop rule's depth for this iteration (module docstring), per row: the batch's depth, or less
    where a row's table holds fewer chain tokens (a cached table replayed without its models)."""
    probs, missing = [], []
    for slot in slots:
        core = slot.run.core
        room = max(0, min(kmax, core.max_new_tokens - core.out_len - 1))
        chain, product, cut = [], 1.0, False
        for j in range(room):
            try:
                product *= slot.run.table.features(core.out_len, j)[1]
            except ChainEnded:
                break
            except ChainMissing:
                cut = True
                break
            chain.append(product)
        probs.append(chain)
        missing.append(cut)
    best, best_rate = 0, -1.0
    for d in range(kmax + 1):
        expected = sum(1 + sum(c[:d]) for c in probs)
        rows = [RowPass(1 + min(d, len(c)), d, min(d, len(c)), 1, s.run.core.t_len, s.run.core.a_len, False,
                        1 + min(d, len(c)), s.slot) for s, c in zip(slots, probs)]
        draft, verify = pricer.iteration_ms(rows)
        rate = expected / max(draft + verify, 1e-9)
        if rate < best_rate * (1 - 1e-9):
            break
        if rate > best_rate:
            best, best_rate = d, rate
    return [min(best, len(c)) if cut else best for c, cut in zip(probs, missing)]


def simulate(setting: Setting | str, stream: Sequence[Request], batch: int, pricer: Pricer, max_new_tokens: int,
             view_context: int = 256, traces: dict | None = None) -> BatchRun:
    """Replay ``stream`` through ``batch`` slots under continuous batching (module docstring). ``traces``: a dict the
    caller keeps across calls on the same tables, where the iterations of per-sequence rules that read no costs are
    replayed once per (table, setting) and reused at every B, layout and seed."""
    setting = Setting(setting) if isinstance(setting, str) else setting.fresh()
    if batch < 1:
        raise BatchReplayError(f"batch size must be >= 1, got {batch}")
    view = batch_view(pricer.costs, batch, view_context + pricer.context)
    queue = deque(sorted(stream, key=lambda r: (r.arrival_ms, r.index)))
    active: list[_Slot] = []
    free = list(range(batch))  # slot ids; a new request takes the lowest free one, as llama-server's slots do
    log = BatchRun()
    clock, bound = 0.0, False
    while queue or active:
        while free and queue and queue[0].arrival_ms <= clock:
            request = queue.popleft()
            active.append(_Slot(request, setting, view, max_new_tokens, bind=not (setting.shared and bound),
                                traces=traces, slot=free.pop(0), admitted_ms=clock))
            bound = True
            log.last_admission_ms = clock
        active.sort(key=lambda slot: slot.slot)
        if not active:
            clock = queue[0].arrival_ms
            continue
        if setting.batch_stop:
            for slot, depth in zip(active, _depth(active, setting.kmax, pricer)):
                slot.run.policy.k = depth
        if setting.free:  # rows short of the deepest, or cut by their table, draft to its depth (disco.replay.free_draft)
            own = [free_draft.own_depth(slot.run) for slot in active]
            deepest = max(d for d, _ in own)
            log.cut += sum(not exact for _, exact in own)
            steps = [slot.step(deepest if d < deepest or not exact else None) for slot, (d, exact) in zip(active, own)]
        else:
            steps = [slot.step() for slot in active]
        draft_ms, verify_ms = pricer.iteration_ms([row for row, _ in steps])
        clock += draft_ms + verify_ms
        log.iterations.append((clock, len(active), sum(e for _, e in steps), draft_ms, verify_ms,
                               sum(row.target_tokens for row, _ in steps), max(row.draft_calls for row, _ in steps)))
        for slot, (_, emitted) in zip(active, steps):
            if emitted:
                slot.emissions.append((clock, emitted))
                if math.isnan(slot.first_ms):
                    slot.first_ms = clock
        for slot in [s for s in active if s.done]:
            active.remove(slot)
            free = sorted(free + [slot.slot])
            _finish(log, slot, clock)
    return log


def _finish(log: BatchRun, slot: _Slot, clock: float) -> None:
    if math.isnan(log.first_finish_ms):
        log.first_finish_ms = clock
    tokens = sum(n for _, n in slot.emissions)
    log.requests.append({"index": slot.request.index, "arrival_ms": slot.request.arrival_ms,
                         "admitted_ms": slot.admitted_ms, "first_ms": slot.first_ms, "finish_ms": clock, "tokens": tokens,
                         "emissions": slot.emissions})
    log.output[slot.request.index] = list(slot.output_ids)


def window(log: BatchRun, open_loop: bool) -> tuple[float, float, bool]:
    """The steady-state window (start ms, end ms, steady?) of a run; the whole run when it has none."""
    end_all = log.iterations[-1][0] if log.iterations else 0.0
    if open_loop:
        arrivals = sorted(r["arrival_ms"] for r in log.requests)
        start, end = (arrivals[len(arrivals) // 10], arrivals[-1]) if arrivals else (0.0, 0.0)
    else:
        start, end = log.first_finish_ms, log.last_admission_ms
    if not (end > start):
        return 0.0, end_all, False
    return start, end, True


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def metrics(log: BatchRun, open_loop: bool = False, whole: bool = False) -> dict:
    """Throughput, latency percentiles and the window of one batched replay (``whole``: the whole run)."""
    start, end, steady = (0.0, log.iterations[-1][0] if log.iterations else 0.0, False) if whole \
        else window(log, open_loop)
    if whole:
        start = -1e-9  # the first iteration's tokens count too
    tokens = sum(it[2] for it in log.iterations if start < it[0] <= end)
    span = end - max(start, 0.0)
    inside = [r for r in log.requests if whole or start <= (r["arrival_ms"] if open_loop else r["first_ms"]) <= end]
    since = "arrival_ms" if open_loop else "admitted_ms"  # closed loop: a request waits for a slot by design
    ttft = [r["first_ms"] - r[since] for r in inside]
    tpot = [(r["finish_ms"] - r["first_ms"]) / (r["tokens"] - 1) for r in inside if r["tokens"] > 1]
    itl = [b[0] - a[0] for r in inside for a, b in zip(r["emissions"], r["emissions"][1:])]
    its = [it for it in log.iterations if start < it[0] <= end]
    return {
        "tokens_per_s": tokens / span * 1000.0 if span > 0 else math.nan,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "tpot_ms_p50": percentile(tpot, 50), "tpot_ms_p99": percentile(tpot, 99),
        "itl_ms_p50": percentile(itl, 50), "itl_ms_p99": percentile(itl, 99),
        "mean_active": float(np.mean([it[1] for it in its])) if its else math.nan,
        "draft_share": (sum(it[3] for it in its) / max(sum(it[3] + it[4] for it in its), 1e-12)) if its else math.nan,
        "window_ms": span, "steady": steady, "requests_in_window": len(inside),
        "cut_share": log.cut / max(1, sum(it[1] for it in log.iterations)),  # free: rows cut by a cached chain
        "_latency": [(r["first_ms"] - r[since],
                      (r["finish_ms"] - r["first_ms"]) / (r["tokens"] - 1) if r["tokens"] > 1 else 0.0) for r in inside],
    }


def goodput(m: dict, span_ms: float, ttft_slo_ms: float, tpot_slo_ms: float) -> float:
    """Requests per second in the window that met both latency targets."""
    good = sum(1 for a, b in m["_latency"] if a <= ttft_slo_ms and b <= tpot_slo_ms)
    return good / span_ms * 1000.0 if span_ms > 0 else math.nan
