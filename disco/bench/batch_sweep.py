"""The Sweep tab's answer per batch size: the batch-size study (``disco.bench.batch``) on the last sweep's prompts,
settings and cost profile, from the one cache's tables (the models attached, so a chain the batch-level stop asks for
is computed rather than missing)."""

from __future__ import annotations

from pathlib import Path

from disco import cache
from disco.bench.batch import BASELINE, BatchStudy, run_study
from disco.bench.batch_answer import answer
from disco.bench.sweep import cached_costs
from disco.costs import model as cost_mod
from disco.costs.batched import resolve_batched
from disco.policies import spec_kind
from disco.replay.tables import build_table
from disco.suites import SuitePrompt, split_of
from disco.tables.fitting import PromptSkipped
from disco.tables.phase import TablePhase

BATCH_KINDS = ("autoregressive", "static", "threshold", "sglang")


def batch_settings(specs: list[str], kmax: int = 20) -> list[str]:
    """The sweep's settings a batch races: the target alone, static K, thresholds, SGLang's shared depth, and the
    batch-level stop at the deepest KMAX the sweep used."""
    kept = [s for s in specs if spec_kind(s) in BATCH_KINDS and "@" not in s]
    return [BASELINE] + kept + [f"batchstop:{kmax}"]


def answer_per_batch(pair, prompts: list[SuitePrompt], specs: list[str], max_new_tokens: int, cost_profile: str,
                     batches, layout: str, cache_dir: Path | None = None, seeds: int = 2):
    """(rows, answer, costs label) of the batch study on these prompts (choices on train, figures on test when both
    splits hold at least two prompts; else on all)."""
    cache_dir = cache.tables_dir() if cache_dir is None else cache_dir
    phase = TablePhase.here(pair, max_new_tokens, cache_dir)
    tables, kept = [], []
    for p in prompts:
        try:
            ids = phase.ids(p)
        except PromptSkipped:
            continue
        tables.append(build_table(pair, ids, max_new_tokens, cache_dir, name=p.id, about=phase.encoder.about(p)))
        kept.append(p)
    name = cost_mod.check_profile(cost_profile)
    measured = cached_costs(pair, [t.prompt_ids for t in tables], 20) if name == cost_mod.MEASURED else None
    costs = resolve_batched(name, measured=measured)
    splits = split_of(kept)
    by_split = {s: [t for p, t in zip(kept, tables) if splits[p.id] == s] for s in ("train", "test")}
    if min(len(v) for v in by_split.values()) < 2:
        by_split = {"all": tables}
    study = BatchStudy(batches=tuple(batches), layouts=(layout,), rates=(), settings=tuple(batch_settings(specs)),
                       seeds=seeds)
    try:
        # in the app's process (threads, a loaded pair, maybe a GPU): one process, never a fork
        rows = run_study(by_split, costs, name, study, max_new_tokens, progress=False, workers=1)
    finally:
        for t in tables:
            if t.dirty:
                t.save()
            t.release()
    return rows, answer(rows), costs.label
