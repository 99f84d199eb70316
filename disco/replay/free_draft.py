"""Drafting for free inside a batch: the batched replay's ``free:SPEC`` variant of a per-sequence rule.

A batch drafts as deep as its deepest drafter: every draft step is one assistant pass over all the batch's drafting
rows (``disco.replay.layouts.draft_passes``), so a row whose own rule stopped early spends its slot in the remaining
steps anyway. Under ``free:SPEC`` such a row keeps drafting until the batch's depth this iteration (the deepest
row's own depth under SPEC), within its own budget (KMAX) and the room left, and those drafts are verified too. The
deepest rows run SPEC unchanged (a token their rule drops stays dropped), so at B = 1, or when every row stops at the
same depth, ``free:SPEC`` is SPEC itself (``tests/unit/test_free_draft.py``). What it buys: accepted tokens from
drafts the batch paid for; what it costs: their verification (nothing in ``padded-k``, which pads every row to K + 1
anyway).

Each row's own depth is found by a dry run of its iteration on a copy (the table is shared, never copied). Replayed
from cached tables without their models, a row's draft ends where its table's chain ends at that position (the table
holds what the rules replayed when it was built, and ``free:`` visits positions they did not): its extension, and
its own rule's draft where the rule would have gone further. ``simulate`` counts those rows (``BatchRun.cut``).
"""

from __future__ import annotations

import copy

from disco.decode.core import IterationRecord
from disco.policies import Policy
from disco.replay.tables import ChainEnded, ChainMissing

PREFIX = "free"


class DraftToDepth:
    """A rule's policy for one iteration that drafts exactly ``depth`` tokens (fewer at EOS or at the room left):
    its budget is cut to ``depth`` and nothing stops or drops a token before; its state and update are the rule's
    own. (The row's KMAX, what ``padded-k`` pads to, stays the rule's: ``disco.replay.batched._row_of``.)"""

    def __init__(self, inner: Policy, depth: int):
        self._inner = inner
        self._depth = int(depth)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def budget(self) -> int:
        return min(self._inner.budget(), self._depth)

    def drop(self, step) -> bool:
        return False

    def stop_after(self, step) -> bool:
        return False

    def keep(self, steps) -> int:
        return len(steps)


def own_depth(run) -> tuple[int, bool]:
    """The assistant passes ``run`` (a ``ReplayRun``) drafts this iteration under its own rule (a dry run on a copy),
    and whether that is exact: False where its table's chain ends before the rule would stop (a cached table without
    its models, at a position no rule replayed when it was built), the depth then being what the chain holds."""
    try:
        return _draft_calls(_probe(run).core), True
    except ChainMissing:
        return stored_depth(run, run.core.budgets()[1]), False


def _probe(run):
    """A copy of ``run`` whose core can draft without touching ``run``: what drafting rebinds is copied (the caches'
    lengths, the modelled clock), what it only reads is shared (the table, the output so far, the records, the rule's
    state: a rule's ``drop`` and ``stop_after`` read it, only ``update`` after verification changes it)."""
    probe = copy.copy(run)
    probe.policy = copy.copy(run.policy)
    core = copy.copy(run.core)
    core.policy, core.backend = probe.policy, probe
    probe.core = core
    return probe


def _draft_calls(core) -> int:
    """The assistant passes the core's next iteration drafts (its draft-stop loop only, within the budget
    ``IterationCore.budgets`` gives ``step``; nothing verified or recorded)."""
    k_policy, budget = core.budgets()
    return core._draft_with_assistant(budget, k_policy, core.out_len).draft_calls if budget else 0


def stored_depth(run, upto: int) -> int:
    """How many draft tokens ``run``'s table gives at its position, up to ``upto`` (all of them with models attached)."""
    position = run.core.out_len
    for j in range(upto):
        try:
            run.table.features(position, j)
        except (ChainEnded, ChainMissing):
            return j
    return upto


def step_to_depth(run, depth: int) -> IterationRecord:
    """One iteration of ``run`` drafting to ``depth`` (or as far as its table's chain goes), then verified as usual."""
    core = run.core
    inner = core.policy
    core.policy = DraftToDepth(inner, stored_depth(run, depth) if inner.drafts else 0)
    try:
        return run.step()
    finally:
        core.policy = inner
