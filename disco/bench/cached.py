"""Cached replay tables found without the models: by the prompt's id, the run's model options and what the prompt
is (``disco.bench.prompts.table_matches``). What re-costs a benchmark under a flat profile without loading anything,
and what tells the Ray driver which prompts still need work, read."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from disco import cache
from disco.bench.build import cached_rows, merge_cluster_rows, prompts_frame
from disco.bench.prompts import Fitting, history_sha, table_matches
from disco.bench.report import write_reports
from disco.bench.runs import environment, replay_grid
from disco.costs import model as cost_mod
from disco.costs.model import flat
from disco.replay.run import replay_many
from disco.replay.tables import ChainMissing, ReplayError, ReplayTable, cached_table_paths
from disco.suites import SuitePrompt

log = logging.getLogger(__name__)
PAIR_FIELDS = ("engine", "dtype", "assistant_precision")  # "auto" in a run's options matches any one of them


def find_cached(cache_dir: Path, prompt: SuitePrompt, want: dict, max_new_tokens: int,
                fitting: Fitting | None = None) -> ReplayTable | None:
    """The one cached table of ``prompt`` for the pair ``want`` describes (``models`` and the ``PAIR_FIELDS``, where
    ``auto`` matches any) that covers ``max_new_tokens``; None when there is none, or several could match (then the
    run must name its engine, dtype and assistant precision)."""
    fitting = fitting or Fitting()
    history = None
    if prompt.history:  # a later turn: its earlier turns must be cached and match this run first
        earlier = [find_cached(cache_dir, e, want, max_new_tokens, fitting) for e in prompt.earlier_turns()]
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
        m = table.meta
        if m.get("models") != want.get("models") or not table.covers(max_new_tokens):
            continue
        defaults = {"engine": "torch", "assistant_precision": "model"}
        if any(want.get(k, "auto") != "auto" and m.get(k, defaults.get(k)) != want[k] for k in PAIR_FIELDS):
            continue
        if table_matches(m, prompt, fitting, max_new_tokens, history):
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


def recost_cached(cfg, picked, prompts: list[SuitePrompt], specs: list, profile_name: str, cluster=None) -> dict | None:
    """``bench`` under a non-measured cost profile from cached tables alone, without loading the models. Returns None
    (the caller then loads them) when a prompt has no usable table or a table lacks a chain token some spec needs."""
    import time

    import pandas as pd

    def _log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    cache_dir = cfg.cache_dir or cache.tables_dir()
    want = {"models": cfg.models, "engine": cfg.engine, "dtype": cfg.dtype,
            "assistant_precision": cfg.assistant_precision}
    tables = {p.id: find_cached(cache_dir, p, want, cfg.max_new_tokens, cfg.fitting) for p in prompts}
    missing = [i for i, t in tables.items() if t is None]
    if missing:
        _log(f"no cached replay table for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} in "
             f"{cache_dir}; loading the models")
        return None
    first = next(iter(tables.values())).meta
    meta = environment(None, {k: first.get(k) for k in ("models", "target", "assistant", "dtype", "device", "engine")})
    meta["assistant_precision"] = first.get("assistant_precision", "model")
    meta.update(command=cfg.command, **picked.describe(), fitting=cfg.fitting.words(),
                max_new_tokens=cfg.max_new_tokens, mode="replay", grid_size=len(specs), cost_profile=profile_name,
                models_loaded=False, prompts_used=len(prompts), prompts_cut=sum(
                    bool((t.meta.get("prompt") or {}).get("cut")) for t in tables.values()), prompts_skipped=[])
    if cluster is not None:
        meta["ray"] = {"address": cfg.cluster.address, "threads": cfg.cluster.threads, **cluster.summary()}
    costs = cost_mod.resolve(profile_name, precision=meta["assistant_precision"])
    start = time.perf_counter()
    drafts: list[dict] = []
    try:
        runs = replay_grid(tables, prompts, specs, cfg.max_new_tokens, costs, meta, drafts)
    except ReplayError as exc:
        _log(f"the cached tables do not cover this grid ({exc}); loading the models")
        return None
    meta["replay_seconds"] = meta["wall_seconds"] = time.perf_counter() - start
    _log(f"replayed {len(specs)} settings on {len(prompts)} cached tables under {profile_name} "
         f"in {meta['replay_seconds']:.1f} s (models not loaded)")
    rows = cached_rows(prompts, tables)
    if cluster is not None:
        rows = merge_cluster_rows(rows, cluster.rows)
    return write_reports(cfg.out, pd.DataFrame(runs), meta, drafts=pd.DataFrame(drafts), prompts=prompts_frame(rows))
