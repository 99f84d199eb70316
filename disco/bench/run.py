"""Benchmarks: static vs dynamic lookahead on a prompt suite, by exact replay and by timed runs.

``python -m disco bench`` (its command line: ``disco.bench.commands``):
  * replay (greedy): per prompt, the target's greedy output and the assistant's chains along it are
    computed once (``disco.replay``, cached on disk); every setting of the grid is replayed exactly
    and its time estimated from per-pass costs measured on this machine (``costs.calibrate``);
  * timed: real end-to-end runs of a short list of strategies with our engine and, back to back,
    transformers' own ``generate(assistant_model=...)`` with matching settings (the peer), interleaved
    per prompt (A B, B A, ...) so drift on a noisy machine hits both alike; models warmed up once;
  * validation: for the timed strategies, replay's predicted iterations and target passes must equal
    the real run's, and predicted seconds must be within ``TIME_TOLERANCE`` of measured.
Outputs (``--out``): runs.csv, summary.csv, summary.md, theory.csv, validation.csv, heatmap.html,
heatmap.svg (PNG needs kaleido, which is not a dependency), timed_iterations.csv, meta.json.

This module runs the benchmark; the parts live by concept: ``disco.bench.suite`` (prompts), ``disco.costs``
(per-pass costs and cost profiles), ``disco.bench.runs`` (the runs table, replay of one prompt),
``disco.bench.peer`` (timed runs and transformers' generate), ``disco.bench.analysis`` (speed-ups, theory,
validation), ``disco.bench.heatmap``, ``disco.bench.report`` (the output files) and ``disco.bench.sweep``
(the Sweep tab's engine).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from disco import cache
from disco.bench.analysis import REFERENCE_SETTING, TIME_TOLERANCE, best_settings, summarize_runs, theory_frame
from disco.bench.peer import run_ours, timed_prompt, warm_up
from disco.bench.report import write_reports
from disco.bench.runs import environment, prepare_table, replay_rows, run_row
from disco.bench.suite import BenchError, DEFAULT_SUITE, SuitePrompt, filter_prompts, load_suite, pick_prompts, split_prompts
from disco.costs import measure as cost_measure, model as cost_mod
from disco.costs.model import CostModel
from disco.models import load_pair, resolve_assistant
from disco.models.pair import encode_prompt
from disco.models.turns import COMPUTE_LOCK
from disco.policies import AUTOREGRESSIVE, Autoregressive, Policy, parse_strategy
from disco.policies.grids import default_grid, with_baseline
from disco.replay.run import replay_many
from disco.replay.tables import ReplayError, ReplayTable, cached_table_paths


@dataclass
class BenchConfig:
    models: str = "embedded"
    suite: str | None = None
    max_new_tokens: int = 64
    out: Path = Path("bench-out")
    mode: str = "both"
    dtype: str = "auto"
    device: str = "auto"
    assistant_precision: str = "auto"
    engine: str = "auto"
    policies: tuple[Policy, ...] = ()          # the replay grid (default: ``disco.policies.grids.default_grid``)
    timed_policies: tuple[Policy, ...] = ()    # what to time (default: the best of the replay, see below)
    timed_prompts: int | None = 6
    prompts: str | None = None
    split: str = "all"
    reps: int = 1
    calibration_reps: int = 2
    cache_dir: Path | None = None              # replay tables (default: the one cache)
    cost_profile: str = "measured"
    peer: bool = True
    other_engine: str | None = None             # also time the target alone on this engine (one run compares both)
    holdout: bool = False                       # time the train split's best settings on the test prompts
    progress: bool = True
    command: str = ""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)


ADAPTIVE_REFERENCE = "adaptive:0.4:20"  # transformers' default once scikit-learn is installed (an hf:adaptive peer)


LLAMA_REFERENCE = "pmin:0.4:3"  # llama.cpp's --spec-draft-n-max default (3), with the p-min its docs use
LOOKUP_REFERENCE = "lookup:10:2"  # transformers PromptLookupCandidateGenerator defaults (10 tokens, n-gram 2)


def default_timed_policies(best: dict, engine: str = "torch") -> list[Policy]:
    """The target alone, the replay's best static K and best threshold, transformers' defaults (fixed and adaptive),
    the best prompt lookup and ``lookup:10:2`` (transformers PromptLookupCandidateGenerator defaults), the best ``copy``; on llama.cpp also its own rule (the replay's best ``pmin`` and ``pmin:0.4:3``), which its own
    speculative example times as the peer. The specs come from the replay's summary, so they are parsed here, once."""
    specs = [AUTOREGRESSIVE, best.get("best_static") or "static:5", best.get("best_threshold"), REFERENCE_SETTING,
             ADAPTIVE_REFERENCE, best.get("best_lookup"), LOOKUP_REFERENCE, best.get("best_copy")]
    if engine == "llamacpp":
        specs += [best.get("best_pmin"), LLAMA_REFERENCE]
    return [parse_strategy(s) for s in dict.fromkeys(s for s in specs if s)]


def run_bench(cfg: BenchConfig, pair=None) -> dict:
    """Run the benchmark and write every output into ``cfg.out``. Returns paths and headline numbers."""
    wall = time.perf_counter()
    prompts = split_prompts(filter_prompts(load_suite(cfg.suite), cfg.prompts), cfg.split)
    if not prompts:
        raise BenchError(f"no prompt of the {cfg.split} split matches --prompts")
    if cfg.holdout and not (split_prompts(prompts, "train") and split_prompts(prompts, "test")):
        raise BenchError("--holdout needs prompts of both splits (train and test) in --prompts")
    specs = with_baseline(cfg.policies or default_grid())
    profile_name = cost_mod.check_profile(cfg.cost_profile)
    if profile_name != cost_mod.MEASURED and cfg.mode != "replay":
        raise BenchError(f"--cost-profile {profile_name} applies to --mode replay only (timed runs are measured "
                         "on this machine)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    if profile_name != cost_mod.MEASURED and pair is None:
        result = recost_cached(cfg, prompts, specs, profile_name)
        if result is not None:
            return result
    pair = resolve_assistant(pair or load_pair(cfg.models, dtype=cfg.dtype, device=cfg.device, engine=cfg.engine),
                             cfg.assistant_precision, log=_log)
    with COMPUTE_LOCK:  # the models are this benchmark's alone while it runs (an app in this process waits)
        return _run_loaded(cfg, pair, prompts, specs, profile_name, wall)


def _run_loaded(cfg: BenchConfig, pair, prompts: list[SuitePrompt], specs: list[Policy], profile_name: str,
                wall: float) -> dict:
    meta = environment(pair)
    meta.update(command=cfg.command, suite=str(cfg.suite or DEFAULT_SUITE.name), max_new_tokens=cfg.max_new_tokens,
                mode=cfg.mode, grid_size=len(specs), time_tolerance_pct=100 * TIME_TOLERANCE)
    encoded = {p.id: encode_prompt(pair, p.prompt, p.chat, cfg.max_new_tokens) for p in prompts}
    runs: list[dict] = []
    summary = pd.DataFrame()
    costs = None
    tables = {}
    theory = None
    drafts: list[dict] = []  # every replayed drafting iteration (acceptance by draft position)
    kmax = max([p.values.get("k", 1) for p in specs] + [1])

    if cfg.mode in ("replay", "both"):
        cache_dir = cfg.cache_dir or cache.tables_dir()
        t0 = time.perf_counter()
        for p in _progress(prompts, len(prompts), "replay tables", cfg.progress):
            tables[p.id], _ = prepare_table(pair, p, specs, cfg.max_new_tokens, cache_dir)
        meta["tables_seconds"] = time.perf_counter() - t0
        # costs are measured after the tables (models warm) and right before the timed runs, so that the
        # validation compares prediction and measurement taken under the same conditions

        def measure() -> CostModel:
            _log(f"calibrating per-pass costs on {pair.describe()['models']} ({meta['dtype']}, {meta['device']}) ...")
            return cost_measure.suite_costs(pair, list(encoded.values()), kmax, reps=cfg.calibration_reps)

        t0 = time.perf_counter()
        costs = cost_mod.resolve(profile_name, measured=measure, precision=meta.get("assistant_precision"))
        meta["calibration_seconds"] = time.perf_counter() - t0
        meta["cost_profile"] = profile_name
        runs += replay_grid(tables, prompts, specs, cfg.max_new_tokens, costs, meta, drafts)
        summary = summarize_runs(pd.DataFrame(runs))
        meta["best"] = best_settings(summary)
        theory = theory_frame(meta["alpha"], costs.cost_ratio, costs, summary)

    if cfg.mode in ("timed", "both"):
        best, pool = meta.get("best", {}), prompts
        if cfg.holdout:  # settings chosen by the train prompts' replay, timed on the test prompts only
            train = [r for r in runs if r.get("mode") == "replay" and r.get("split") == "train"]
            pool = split_prompts(prompts, "test")
            if not train or not pool:  # checked up front (run_bench, config_from_args); kept for callers of this API
                raise BenchError("--holdout needs a replay of both splits (--mode both --split all)")
            best = meta["best_train"] = best_settings(summarize_runs(pd.DataFrame(train)))
            meta["timed_split"] = "test"
        timed_specs = with_baseline(cfg.timed_policies or default_timed_policies(best, pair.engine))
        timed_prompts = pick_prompts(pool, cfg.timed_prompts)
        meta["timed_strategies"] = [p.spec for p in timed_specs]
        meta["prompts_timed"] = len(timed_prompts)
        other = _other_engine(cfg, pair, meta)
        warm_up(pair, encoded[timed_prompts[0].id])
        t0 = time.perf_counter()
        records = []
        for j, p in enumerate(_progress(timed_prompts, len(timed_prompts), "timed", cfg.progress)):
            ref = tables[p.id].reference_for(cfg.max_new_tokens) if p.id in tables else None
            rows, recs = timed_prompt(pair, p, timed_specs, cfg.max_new_tokens, meta, cfg.reps, ref, cfg.peer,
                                      order_offset=j, costs=costs)
            runs += rows
            records += recs
            if other is not None:  # right after this prompt's lanes, so both engines meet the machine alike
                runs += engine_rows(other, p, cfg.max_new_tokens, meta, cfg.reps, rows, ref)
        meta["timed_seconds"] = time.perf_counter() - t0
        if records:
            frame = pd.DataFrame(records)
            frame["confidences"] = frame["confidences"].map(lambda cs: " ".join(f"{c:.4f}" for c in cs))
            frame.to_csv(cfg.out / "timed_iterations.csv", index=False)

    meta["wall_seconds"] = time.perf_counter() - wall
    return write_reports(cfg.out, pd.DataFrame(runs), meta, theory, drafts=pd.DataFrame(drafts))


def _other_engine(cfg: BenchConfig, pair, meta: dict):
    """The pair on ``cfg.other_engine`` (loaded and warmed before anything is timed), or None."""
    if not cfg.other_engine or cfg.other_engine == pair.engine:
        return None
    _log(f"loading {cfg.models} on the {cfg.other_engine} engine too (its target alone is timed beside ours) ...")
    other = load_pair(cfg.models, dtype="auto", device=cfg.device, engine=cfg.other_engine, log=_log)
    other.warmup()
    meta["other_engine"] = {k: v for k, v in other.describe().items() if k != "assistant_precision"}
    return other


def engine_rows(other, prompt: SuitePrompt, max_new_tokens: int, meta: dict, reps: int, rows: list[dict],
                reference: list[int] | None = None) -> list[dict]:
    """The target alone on the other engine (``ENGINE:autoregressive``), timed like our lanes; its speed-up is against
    this run's own autoregressive lane on the same prompt (so a value below 1 says how much slower that engine is)."""
    ids = encode_prompt(other, prompt.prompt, prompt.chat, max_new_tokens)
    runs = [run_ours(other, ids, Autoregressive(), max_new_tokens) for _ in range(reps)]
    ours = next((r for r in rows if r["strategy"] == AUTOREGRESSIVE and r["implementation"] == "ours"), None)
    s = dict(runs[0]["summary"], seconds=statistics.median(r["summary"]["seconds"] for r in runs),
             decode_seconds=statistics.median(r["summary"]["decode_seconds"] for r in runs))
    # the same text as ours? (the torch engine runs the GGUF's weights dequantized to bf16: other numerics)
    same = runs[0]["output_ids"] == list(reference) if reference is not None else None
    return [run_row(prompt, f"{other.engine}:{AUTOREGRESSIVE}", "timed", other.engine, s, None,
                    ours["seconds"] if ours else math.nan, meta, prompt_tokens=len(ids), reps=reps, same_as_ours=same,
                    engine=other.engine, dtype=other.dtype_name)]


def replay_grid(tables: dict, prompts: list[SuitePrompt], specs: list[Policy], max_new_tokens: int, costs: CostModel,
                meta: dict, positions: list[dict] | None = None) -> list[dict]:
    """Every policy replayed on every prompt's table under ``costs`` (the runs table's replay rows); records in
    ``meta`` what the report needs of it: the costs, the prompts replayed, α (the assistant's first draft equals
    the target's token, over all positions) and c; appends each drafting iteration to ``positions`` when given."""
    meta["costs"] = costs.to_dict()
    runs: list[dict] = []
    hits = total = 0
    for p in prompts:
        table = tables[p.id]
        results = replay_many(table, specs, max_new_tokens, costs)
        runs += replay_rows(p, table, results, meta)
        if positions is not None:  # each run's drafts, for the acceptance by draft position
            positions += [{"prompt_id": p.id, "kind": p.kind, "split": p.split, "strategy": spec,
                           "lookahead": r.lookahead, "accepted": r.accepted}
                          for spec, res in results.items() for r in res.records if r.lookahead]
        h, n = table.first_token_agreement(max_new_tokens)
        hits, total = hits + h, total + n
    meta.update(prompts_replayed=len(prompts), alpha=hits / total if total else math.nan, cost_ratio=costs.cost_ratio)
    return runs


def _cached_table(cache_dir: Path, prompt: SuitePrompt, cfg: BenchConfig):
    """The one cached table of ``prompt`` that matches the run's models (and dtype / assistant precision when
    they are given), or None when there is none or several could match."""
    found = []
    for path in cached_table_paths(cache_dir, prompt.id):
        try:
            table = ReplayTable.from_dict(json.loads(path.read_text()), path)
        except (OSError, ValueError, KeyError, TypeError, ReplayError):
            continue
        m = table.meta
        if m.get("models") != cfg.models or not table.covers(cfg.max_new_tokens):
            continue
        if cfg.engine != "auto" and m.get("engine", "torch") != cfg.engine:
            continue
        if cfg.dtype != "auto" and m.get("dtype") != cfg.dtype:
            continue
        if cfg.assistant_precision != "auto" and m.get("assistant_precision", "model") != cfg.assistant_precision:
            continue
        found.append(table)
    kinds = {(t.meta.get("engine", "torch"), t.meta.get("dtype"), t.meta.get("assistant_precision", "model"))
             for t in found}
    if len(kinds) > 1:
        _log(f"{prompt.id}: cached tables for {sorted(kinds)}; give --engine, --dtype and --assistant-precision to pick one")
        return None
    return found[0] if found else None


def recost_cached(cfg: BenchConfig, prompts: list[SuitePrompt], specs: list[Policy], profile_name: str) -> dict | None:
    """Replay every spec from cached tables under a non-measured cost profile, without loading the models.

    Returns None (the caller then loads the models) when a prompt has no usable table or a table lacks a chain
    token some spec needs."""
    cache_dir = cfg.cache_dir or cache.tables_dir()
    tables = {p.id: _cached_table(cache_dir, p, cfg) for p in prompts}
    missing = [i for i, t in tables.items() if t is None]
    if missing:
        _log(f"no cached replay table for {', '.join(missing)} in {cache_dir}; loading the models")
        return None
    first = next(iter(tables.values())).meta
    meta = environment(None, {k: first.get(k) for k in ("models", "target", "assistant", "dtype", "device", "engine")})
    meta["assistant_precision"] = first.get("assistant_precision", "model")
    meta.update(command=cfg.command, suite=str(cfg.suite or DEFAULT_SUITE.name), max_new_tokens=cfg.max_new_tokens,
                mode="replay", grid_size=len(specs), cost_profile=profile_name, models_loaded=False)
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
    return write_reports(cfg.out, pd.DataFrame(runs), meta, drafts=pd.DataFrame(drafts))
