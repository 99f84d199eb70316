"""A study's table phase: every prompt's replay table built, or found in the cache, the prompts the length rule drops
set aside, and one row per prompt of what happened to it (``disco.tables.rows``).

``TablePhase(spec, fitting, cache_dir, max_new_tokens, executor).ensure(prompts, grid, costs, fill)`` is the one
loop every study runs; the executor decides where the work happens: ``Here`` (this process, the pair loaded here, one
prompt after another) or ``disco.tables.workers.OnRay`` (a Ray cluster, whose only result is the cache: the tables
are then read from it). ``cached(prompts)`` finds the tables without any model (re-costing). With the models here the
phase also serves one prompt at a time (``ids``, ``table``, ``prepare``: the Sweep, sampling): a later turn of a chat
is encoded only after its earlier turns' tables are built, in order (``disco.tables.encoding``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from disco.replay.tables import ReplayTable
from disco.suites import SuitePrompt
from disco.tables import build as table_build
from disco.tables.encoding import PromptEncoder
from disco.tables.fitting import Fitting, PromptSkipped
from disco.tables.identity import PairSpec
from disco.tables.lookup import find_cached
from disco.tables.rows import built_by, prompt_row, table_row


@dataclass
class TableSet:
    """What a phase gives a study: the kept prompts' tables by id, the prompts kept (in order), a row per prompt, and
    (a lookup without the models) the prompts it found no table for."""

    tables: dict[str, ReplayTable]
    prompts: list[SuitePrompt]
    rows: list[dict]
    missing: list[str] = field(default_factory=list)


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)


class Here:
    """The sequential executor: the pair loaded in this process, one prompt after another. A table already in the
    cache costs only its replay check; the length rule's skips are rows with their reason."""

    def __init__(self, pair, progress: bool = True):
        self.pair, self.progress = pair, progress

    def ensure(self, phase: "TablePhase", prompts: list[SuitePrompt], grid: list, costs: tuple, fill) -> TableSet:
        tables, kept, rows = {}, [], []
        for p in _progress(prompts, len(prompts), "replay tables", self.progress):
            start = time.perf_counter()
            try:
                table, _ = phase.prepare(p, grid, costs, fill)
            except PromptSkipped:
                rows.append(prompt_row(p, phase.encoder))
                continue
            tables[p.id] = table
            kept.append(p)
            where = built_by(table, phase.built.get(p.id), seconds=time.perf_counter() - start)
            rows.append(prompt_row(p, phase.encoder, **where))
        return TableSet(tables, kept, rows)


class TablePhase:
    """The table phase of one study (module doc). ``built`` records the tables this run built elsewhere (a Ray
    worker's name and times, by prompt id); ``using`` gives the same phase, and that record, another executor."""

    def __init__(self, spec: PairSpec, fitting: Fitting | None, cache_dir: Path | None, max_new_tokens: int,
                 executor=None, built: dict | None = None, encoder: PromptEncoder | None = None):
        self.spec, self.fitting, self.cache_dir = spec, fitting or Fitting(), cache_dir
        self.max_new_tokens, self.executor = max_new_tokens, executor
        self.built: dict[str, dict] = {} if built is None else built
        self.pair = getattr(executor, "pair", None)
        if encoder is None and self.pair is not None:
            encoder = PromptEncoder(self.pair, max_new_tokens, self.fitting)
        self.encoder = encoder

    @classmethod
    def here(cls, pair, max_new_tokens: int, cache_dir: Path | None, fitting: Fitting | None = None,
             progress: bool = False, encoder: PromptEncoder | None = None) -> "TablePhase":
        """The phase of a pair already loaded (the app's Sweep, a study's own encoder)."""
        return cls(PairSpec.of(pair), fitting, cache_dir, max_new_tokens, Here(pair, progress), encoder=encoder)

    def using(self, executor) -> "TablePhase":
        return TablePhase(self.spec, self.fitting, self.cache_dir, self.max_new_tokens, executor, self.built)

    def ensure(self, prompts: list[SuitePrompt], grid: list, costs: tuple = (), fill=None) -> TableSet:
        """Every prompt's table, holding the chain tokens ``grid`` needs under a free assistant and each of ``costs``,
        and what ``fill(table)`` reads (a picklable function where the executor is a cluster)."""
        return self.executor.ensure(self, list(prompts), list(grid), tuple(costs), fill)

    def cached(self, prompts: list[SuitePrompt]) -> TableSet:
        """The prompts' tables found in the cache without any model (``missing``: those with none)."""
        found = {p.id: find_cached(self.cache_dir, p, self.spec, self.max_new_tokens, self.fitting) for p in prompts}
        kept = [p for p in prompts if found[p.id] is not None]
        rows = [table_row(p, found[p.id], **built_by(found[p.id], self.built.get(p.id))) for p in kept]
        return TableSet({p.id: found[p.id] for p in kept}, kept, rows, [i for i, t in found.items() if t is None])

    def encode(self, prompts: list[SuitePrompt]) -> TableSet:
        """The prompts the length rule keeps, and a row per prompt (timed-only runs: no table but earlier turns')."""
        kept, rows = [], []
        for p in prompts:
            try:
                self.ids(p)
                kept.append(p)
            except PromptSkipped:
                pass
            rows.append(prompt_row(p, self.encoder))
        return TableSet({}, kept, rows)

    # -- one prompt, the models here ------------------------------------------------------------

    def ids(self, prompt: SuitePrompt) -> list[int]:
        """The prompt's token ids (PromptSkipped where the length rule drops it), its earlier turns' tables built
        first."""
        self.answer_earlier(prompt)
        return self.encoder.ids(prompt)

    def answer_earlier(self, prompt: SuitePrompt) -> None:
        """Build the tables of a later turn's earlier turns, oldest first, and give the encoder their answers; stops at
        an earlier turn the length rule drops (the later turn is then skipped with it)."""
        for earlier in prompt.earlier_turns():
            if self.encoder.answered(earlier):
                continue
            try:
                ids = self.encoder.ids(earlier)
            except PromptSkipped:
                return
            with table_build.opened(self.pair, ids, self.max_new_tokens, self.cache_dir, earlier.id,
                                    self.encoder.about(earlier)) as table:
                self.encoder.answer(earlier, table)

    def table(self, prompt: SuitePrompt, progress=None):
        """``with phase.table(prompt) as table:`` the prompt's table, the models attached (``disco.tables.build.opened``);
        ``progress(done, total)`` while its reference is decoded."""
        ids = self.ids(prompt)
        return table_build.opened(self.pair, ids, self.max_new_tokens, self.cache_dir, prompt.id,
                                  self.encoder.about(prompt), progress)

    def prepare(self, prompt: SuitePrompt, grid: list, costs: tuple = (), fill=None):
        """(table, the free assistant's results): the prompt's table holding what ``grid``, ``costs`` and ``fill``
        need (``disco.tables.build.prepare``)."""
        ids = self.ids(prompt)
        return table_build.prepare(self.pair, prompt, ids, self.encoder.about(prompt), grid, self.max_new_tokens,
                                   self.cache_dir, fill, costs)
