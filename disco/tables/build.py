"""One prompt's replay table, built or loaded, made to hold what a study replays on it, saved and let go: the step
every study repeats (the bench, re-costing's fallback, train, sampling, the Sweep, the machine profile and a
later turn's earlier turns), written once."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

from disco.costs.model import flat
from disco.replay.run import replay_many
from disco.replay.tables import ReplayTable, build_table
from disco.suites import SuitePrompt


@contextlib.contextmanager
def opened(pair, ids: list[int], max_new_tokens: int, cache_dir: Path | None, name: str, about: dict | None = None,
           progress: Callable[[int, int], None] | None = None) -> Iterator[ReplayTable]:
    """The table of these prompt ids (``build_table``: from ``cache_dir``, or its reference computed), the models
    attached for the block; afterwards saved where the block added chains to it, and its assistant session let go
    (a benchmark holds a table per prompt: chains still missing later get a new session). A block that raises
    (an interrupted Sweep) leaves what it added unsaved."""
    table = build_table(pair, ids, max_new_tokens, cache_dir, name=name, progress=progress, about=about)
    try:
        yield table
        if table.dirty:
            table.save()
    finally:
        table.release()


def prepare(pair, prompt: SuitePrompt, ids: list[int], about: dict, policies: list, max_new_tokens: int,
            cache_dir: Path | None, fill=None, costs: tuple = ()):
    """Build (or load) one prompt's table and make sure it holds every chain token ``policies`` need under a free
    assistant and under each of ``costs`` (rules that read the cost profile draft differently under each), and what
    ``fill(table)`` reads (the classifier's training samples). Returns (table, the free assistant's results); the
    table's ``stats`` add this process's chain work to its build times."""
    with opened(pair, ids, max_new_tokens, cache_dir, prompt.id, about) as table:
        # a cost-aware policy needs some cost model to run; a free assistant drafts the deepest chains (what a
        # profile not given here needs beyond them is computed when the grid is replayed with the models attached)
        results = replay_many(table, policies, max_new_tokens, flat(0.0))
        for model in costs:
            replay_many(table, policies, max_new_tokens, model)
        if fill is not None:
            fill(table)
        if table.builder is not None and table.builder.passes:
            table.stats["chain_passes"] = table.stats.get("chain_passes", 0) + table.builder.passes
            table.stats["chain_seconds"] = table.stats.get("chain_seconds", 0.0) + table.builder.ms / 1000.0
            table.builder.passes, table.builder.ms = 0, 0.0
    return table, results
