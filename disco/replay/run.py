"""Replay: the iteration core's second backend. Any policy runs over a table (``disco.replay.tables``) instead of the
models: drafts come from the table's chains, verification from its reference (greedy: accept the longest prefix
of the drafts equal to it, then its own token), and each pass's cost from a cost model (``disco.costs``), so the
same records as a live run come out, on a modelled clock.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from disco.costs.model import CostModel
from disco.decode.core import CoreView, Drafted, IterationCore, Verdict
from disco.decode.trace import IterationRecord, iterations_frame, summarize
from disco.errors import InputError
from disco.policies import Policy, RunContext
from disco.replay.tables import ReplayError, ReplayTable


@dataclass
class ReplayResult:
    strategy: str
    records: list[IterationRecord]
    output_ids: list[int]
    assistant_tokens: int = 0  # tokens fed to the assistant (prefill included)
    policy: Policy | None = None  # the policy replayed (its kind and parameters, for the runs table)

    def frame(self):
        return iterations_frame(self.records)

    def summary(self) -> dict:
        row = summarize(self.strategy, self.frame())
        row["overhead_pct"] = math.nan  # replay has no engine overhead to measure
        return row


class ReplayRun(CoreView):
    """One policy replayed over a table: the replay backend of the iteration core, one iteration per ``step()``.

    Drafts come from the table's chains, verification from its reference (greedy: accept the longest prefix
    of the drafts equal to it, then its own token), and pass costs from ``costs`` (none: times are nan)."""

    def __init__(self, table: ReplayTable, policy: Policy, max_new_tokens: int | None = None,
                 costs: CostModel | None = None, bind: bool = True):
        m = table.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if m < 1:
            raise InputError(f"max_new_tokens must be positive, got {m}")
        self.table = table
        self.policy = policy
        self.max_new_tokens = m
        self.reference = table.reference_for(m)
        self.costs = costs
        self.assistant_precision = str(table.meta.get("assistant_precision", "model"))
        self._now = 0.0  # modelled ms: advanced by each pass's cost
        self.core = IterationCore(policy, table.prompt_ids, m, table.eos, self)
        if bind:  # False: a policy whose state a batch shares, already bound by the batch's first sequence
            policy.bind(RunContext(costs=costs, reference=list(self.reference)))

    # -- the core's backend ---------------------------------------------------------------------

    def clock(self) -> float:
        return self._now

    def _charge(self, fn, n: int) -> float:
        ms = fn(n) if self.costs is not None else math.nan
        self._now += ms
        return ms

    def draft(self, core: IterationCore, index: int, fed: int) -> Drafted:
        token, prob, entropy, margin, top10 = self.table.features(core.out_len, index)
        return Drafted(token, prob, entropy, margin, self._charge(self.costs.assistant_ms if self.costs else None, fed),
                       top10)

    def verify(self, core: IterationCore, fed: int, steps) -> Verdict:
        ms = self._charge(self.costs.target_ms if self.costs else None, fed)
        ref, out_len = self.reference, core.out_len
        accepted = 0
        while accepted < len(steps) and out_len + accepted < len(ref) and steps[accepted].token == ref[out_len + accepted]:
            accepted += 1
        if out_len + accepted < len(ref):
            return Verdict(accepted, ref[out_len + accepted], ms)
        if accepted and ref[-1] in self.table.eos:  # an accepted EOS draft ends the output; no target token follows
            return Verdict(accepted, ref[-1], ms)
        raise ReplayError("the reference ended without EOS before max_new_tokens")

    def probe(self, core: IterationCore, drafts: list[int]) -> int:
        return len(drafts)  # the reference is exact: the oracle's drop() already kept only what is accepted

    def rollback(self, t_len: int, a_len: int) -> None:
        pass  # replay has no caches; the core keeps the lengths that decide what each pass is fed

    def step(self) -> IterationRecord:
        return self.core.step()

    def result(self) -> ReplayResult:
        return ReplayResult(self.policy.spec, self.records, self.reference[: self.core.out_len], self.assistant_tokens,
                            self.policy)


def replay_many(table: ReplayTable, policies: Iterable[Policy], max_new_tokens: int | None = None,
                costs: CostModel | None = None, progress: Callable[[float], None] | None = None) -> dict[str, ReplayResult]:
    """Replay several policies on one table, always advancing the one furthest behind (results by spec).

    Ordering by position keeps the lazy chain computation moving forward along the text, so the
    assistant's cache is reused instead of rebuilt. ``progress(fraction)`` is called (at most about
    four times a second) with the position of the run furthest behind, as a fraction of the output.
    """
    runs = [ReplayRun(table, policy, max_new_tokens, costs) for policy in policies]
    heap = [(0, i) for i in range(len(runs))]
    heapq.heapify(heap)
    last = time.monotonic()
    total = max(1, len(runs[0].reference)) if runs else 1
    while heap:
        position, i = heapq.heappop(heap)
        if progress is not None and time.monotonic() - last > 0.25:
            progress(min(1.0, position / total))
            last = time.monotonic()
        run = runs[i]
        run.step()
        if not run.done:
            heapq.heappush(heap, (run.position, i))
    return {run.policy.spec: run.result() for run in runs}


def replay(table: ReplayTable, policy: Policy, max_new_tokens: int | None = None,
           costs: CostModel | None = None) -> ReplayResult:
    """Replay one policy on one table."""
    return next(iter(replay_many(table, [policy], max_new_tokens, costs).values()))
