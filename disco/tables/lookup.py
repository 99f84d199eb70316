"""Cached replay tables found without the models: by the prompt's id, the pair the run names (``PairSpec``) and what
the prompt is (``disco.tables.identity.table_matches``). What re-costs a benchmark without loading anything, what
tells the Ray driver which prompts still need work, and what reads back the tables a cluster built."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from disco.costs.model import flat
from disco.replay.run import replay_many
from disco.replay.tables import ChainMissing, ReplayError, ReplayTable, cached_table_paths
from disco.suites import SuitePrompt
from disco.tables.fitting import Fitting
from disco.tables.identity import PAIR_FIELDS, PairSpec, history_sha, table_matches

log = logging.getLogger(__name__)


def find_cached(cache_dir: Path, prompt: SuitePrompt, spec, max_new_tokens: int,
                fitting: Fitting | None = None) -> ReplayTable | None:
    """The one cached table of ``prompt`` for the pair ``spec`` names (a ``PairSpec``, or the dict of its fields callers
    gave before; ``auto`` matches any) that covers ``max_new_tokens``; None when there is none, or several could match
    (then the run must name its engine, dtype and assistant precision)."""
    spec, fitting = PairSpec.coerce(spec), fitting or Fitting()
    history = None
    if prompt.history:  # a later turn: its earlier turns must be cached and match this run first
        earlier = [find_cached(cache_dir, e, spec, max_new_tokens, fitting) for e in prompt.earlier_turns()]
        if any(t is None for t in earlier):
            return None
        history = history_sha([(list(t.prompt_ids), list(t.reference_for(max_new_tokens))) for t in earlier])
    found = []
    for path in cached_table_paths(cache_dir, prompt.id):
        try:
            table = ReplayTable.from_dict(json.loads(path.read_text()), path)
        except (OSError, ValueError, KeyError, TypeError, ReplayError) as exc:
            log.warning("ignoring unreadable cached table %s: %s", path, exc)
            continue
        if not spec.matches(table.meta) or not table.covers(max_new_tokens):
            continue
        if table_matches(table.meta, prompt, fitting, max_new_tokens, history):
            found.append(table)
    kinds = {tuple(t.meta.get(k) for k in PAIR_FIELDS) for t in found}
    if len(kinds) > 1:
        log.warning("%s: cached tables for %s; give --engine, --dtype and --assistant-precision to pick one",
                    prompt.id, sorted(map(str, kinds)))
        return None
    return found[0] if found else None


def holds_grid(table: ReplayTable, policies: list, max_new_tokens: int, fill=None, costs: tuple = ()) -> bool:
    """Whether every policy replays on the table as it is (under a free assistant and each of ``costs``), and
    ``fill(table)`` runs: no chain token missing."""
    try:
        for model in (flat(0.0), *costs):
            replay_many(table, policies, max_new_tokens, model)
        if fill is not None:
            fill(table)
    except ChainMissing:
        return False
    return True


def cached_files(cache_dir: Path, prompts: list[SuitePrompt]) -> dict[str, str]:
    """The cached files of these prompts' tables (their earlier turns' too): file name -> text."""
    names = {q.id for p in prompts for q in [*p.earlier_turns(), p]}
    return {path.name: path.read_text() for name in names for path in cached_table_paths(cache_dir, name)}
