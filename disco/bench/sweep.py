"""The Sweep tab's engine: replay a grid prompt by prompt and yield the growing results (the UI renders them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from disco import cache
from disco.bench.analysis import add_decode_speedup, summarize_runs
from disco.bench.runs import environment, replay_rows
from disco.costs import model as cost_mod
from disco.costs.measure import cached_costs, known_costs
from disco.costs.model import CostModel
from disco.errors import BenchError, Interrupted
from disco.policies import Policy
from disco.policies.grids import deepest_draft, with_baseline
from disco.replay.run import replay_many
from disco.suites import SuitePrompt
from disco.tables.fitting import Fitting, PromptSkipped
from disco.tables.phase import TablePhase


@dataclass
class SweepUpdate:
    done: int                 # prompts finished (skipped ones included)
    total: int
    runs: pd.DataFrame        # replay rows so far
    summary: pd.DataFrame
    message: str
    skipped: dict[str, str] = field(default_factory=dict)  # prompts the length rule dropped, and why
    cut: dict[str, int] = field(default_factory=dict)       # prompts the rule cut, and by how many tokens


def sweep(pair, prompts: list[SuitePrompt], policies: list[Policy], max_new_tokens: int, cache_dir: Path | None = None,
          on_progress: Callable[[float, str], None] | None = None,
          should_stop: Callable[[], bool] | None = None, cost_profile: str | None = None,
          fitting: Fitting | None = None) -> Iterator[SweepUpdate]:
    """Replay ``policies`` (a grid, ``disco.policies.grids``) on ``prompts``, one prompt at a time, yielding the
    growing results after each. Tables live in ``cache_dir`` (default: the one cache), so what the background
    profile or an earlier sweep computed is replayed without the models.

    ``cost_profile`` (``measured`` by default, ``flat:C`` or a CSV path, see disco.costs) only changes the time
    estimates; under a non-measured profile nothing is timed, so with cached tables the models are not run.

    ``on_progress(fraction, message)`` reports the work inside a prompt (for progress bars). ``should_stop`` is
    polled with every progress report (at most about every quarter second or decoded token): when it turns
    true the prompt in progress is dropped (its cached table is not saved) and the sweep ends; every update
    yielded before holds only completed prompts. ``fitting``: the length rule (``disco.tables.fitting``); a prompt it
    skips counts as done and is named in ``SweepUpdate.skipped``.
    """
    if not prompts:
        raise BenchError("pick at least one prompt")
    cache_dir = cache.tables_dir() if cache_dir is None else cache_dir
    policies = with_baseline(policies)
    phase = TablePhase.here(pair, max_new_tokens, cache_dir, fitting)
    kmax = deepest_draft(policies)
    meta = environment(pair)
    meta["max_new_tokens"] = max_new_tokens
    report = on_progress or (lambda fraction, message: None)
    costs = sweep_costs(pair, _single_turn_ids(prompts, phase), kmax, cost_profile, meta, report)
    runs: list[dict] = []
    n = len(prompts)
    for i, p in enumerate(prompts):
        def at(fraction, what, i=i, p=p):
            if should_stop is not None and should_stop():
                raise Interrupted(p.id)
            report((i + fraction) / n, f"prompt {i + 1}/{n} ({p.id}): {what}")

        try:
            at(0.0, "target's greedy output")
            try:
                phase.ids(p)
            except PromptSkipped:
                yield _update(i + 1, n, runs, phase)
                continue
            # an interrupted prompt's table is let go unsaved (``disco.tables.build.opened``)
            with phase.table(p, progress=lambda done, total: at(0.5 * done / total,
                                                                f"target's greedy output {done}/{total}")) as table:
                results = replay_many(table, policies, max_new_tokens, costs,
                                      progress=lambda f: at(0.5 + 0.5 * f, "assistant's chains"))
        except Interrupted:
            return
        runs += replay_rows(p, table, results, meta)
        yield _update(i + 1, n, runs, phase)


def _update(done: int, total: int, runs: list[dict], phase: TablePhase) -> SweepUpdate:
    frame = add_decode_speedup(pd.DataFrame(runs))
    return SweepUpdate(done, total, frame, summarize_runs(frame), f"{done}/{total} prompts replayed",
                       dict(phase.encoder.skipped), phase.encoder.cut)


def _single_turn_ids(prompts: list[SuitePrompt], phase: TablePhase) -> list[list[int]]:
    """Token ids to calibrate costs on (if none are cached yet): the single-turn prompts that fit, which needs no model;
    else the first multi-turn prompt that fits (its earlier turns are decoded, as the sweep would anyway)."""
    out = []
    for p in sorted(prompts, key=lambda p: bool(p.history)):
        if p.history and out:
            break
        try:
            out.append(phase.ids(p))
        except PromptSkipped:
            continue
    if not out:
        skipped = phase.encoder.skipped
        raise BenchError(f"no selected prompt fits: {next(iter(skipped.values()), 'none could be encoded')}")
    return out


def sweep_costs(pair, encoded: list[list[int]], kmax: int, cost_profile: str | None,
                meta: dict | None = None, report: Callable[[float, str], None] | None = None) -> CostModel:
    """The cost model of a Sweep: ``measured`` (calibrated once per session and cached) or a hypothetical profile,
    expressed in this machine's target step when that is already known (it only scales the estimated seconds)."""
    name = cost_mod.check_profile(cost_profile)
    if meta is not None:
        meta["cost_profile"] = name
    if name == cost_mod.MEASURED:
        if report is not None:
            report(0.0, "measuring per-pass costs (once per session)")
        return cached_costs(pair, encoded, kmax)
    known = known_costs(pair)
    precision = (meta or {}).get("assistant_precision") or getattr(pair, "assistant_precision", None)
    return cost_mod.resolve(name, precision=precision, step_ms=known.target_ms(1) if known is not None else None)


def replay_iterations(pair, prompt: SuitePrompt, policy: Policy, max_new_tokens: int, cache_dir: Path | None = None,
                      cost_profile: str | None = None, fitting: Fitting | None = None) -> pd.DataFrame:
    """The per-iteration trace replay predicts for one setting on one prompt (for the Sweep tab's detail view)."""
    phase = TablePhase.here(pair, max_new_tokens, cache.tables_dir() if cache_dir is None else cache_dir, fitting)
    with phase.table(prompt) as table:
        costs = sweep_costs(pair, [list(table.prompt_ids)], 20, cost_profile, environment(pair))
        results = replay_many(table, [policy], max_new_tokens, costs)
    return results[policy.spec].frame()
