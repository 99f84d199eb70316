"""Re-costing a benchmark from cached tables alone: ``bench`` under a non-measured cost profile, the tables found
without the models (``disco.tables.phase.TablePhase.cached``). ``find_cached`` and ``holds_grid`` live in
``disco.tables.lookup`` (imported here for the callers that took them from this module)."""

from __future__ import annotations

import sys
import time

import pandas as pd

from disco.bench.report import write_reports
from disco.bench.runs import replay_grid, run_meta
from disco.costs import model as cost_mod
from disco.replay.tables import ReplayError
from disco.suites import SuitePrompt
from disco.tables.identity import PAIR_FIELDS
from disco.tables.lookup import find_cached, holds_grid
from disco.tables.phase import TablePhase, TableSet
from disco.tables.rows import prompts_frame

__all__ = ["PAIR_FIELDS", "find_cached", "holds_grid", "recost_cached"]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def recost_cached(cfg, picked, prompts: list[SuitePrompt], specs: list, profile_name: str, phase: TablePhase,
                  found: TableSet | None = None, ray=None) -> dict | None:
    """``bench`` under a non-measured cost profile from cached tables alone (``found``, or the phase's lookup),
    without loading the models. Returns None (the caller then loads them) when a prompt has no usable table or a
    table lacks a chain token some spec needs. ``ray``: the cluster executor that built them, for the report."""
    found = found if found is not None else phase.cached(prompts)
    if found.missing:
        missing = found.missing
        _log(f"no cached replay table for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} in "
             f"{phase.cache_dir}; loading the models")
        return None
    tables = found.tables
    cut = sum(bool((t.meta.get("prompt") or {}).get("cut")) for t in tables.values())
    meta = run_meta(cfg, picked, specs, "replay", tables=tables, cost_profile=profile_name, models_loaded=False,
                    prompts_used=len(prompts), prompts_cut=cut, prompts_skipped=[])
    if ray is not None:
        meta["ray"] = ray.describe()
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
    return write_reports(cfg.out, pd.DataFrame(runs), meta, drafts=pd.DataFrame(drafts),
                         prompts=prompts_frame(found.rows))
