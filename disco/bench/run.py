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

This module runs the benchmark; the parts live by concept: ``disco.suites`` (prompts), ``disco.costs``
(per-pass costs and cost profiles), ``disco.bench.runs`` (the runs table, replay of one prompt),
``disco.bench.peer`` (timed runs and transformers' generate), ``disco.bench.analysis`` (speed-ups, theory,
validation), ``disco.bench.heatmap``, ``disco.bench.report`` (the output files) and ``disco.bench.sweep``
(the Sweep tab's engine).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from disco import cache
from disco.bench.analysis import REFERENCE_SETTING, TIME_TOLERANCE, best_settings, summarize_runs, theory_frame
from disco.bench.cached import recost_cached
from disco.bench.peer import run_ours, timed_prompt, warm_up
from disco.bench.report import write_reports
from disco.bench.runs import replay_grid, run_meta, run_row
from disco.costs import measure as cost_measure, model as cost_mod, profile as profiles
from disco.costs.model import CostModel
from disco.errors import BenchError
from disco.models import load_pair, resolve_assistant
from disco.models.turns import COMPUTE_LOCK
from disco.policies import AUTOREGRESSIVE, Autoregressive, Policy, parse_strategy
from disco.policies.grids import deepest_draft, default_grid, with_baseline
from disco.suites import Picked, Selection, SuitePrompt, pick, pick_prompts, split_prompts
from disco.tables.cluster import ClusterConfig
from disco.tables.fitting import Fitting
from disco.tables.identity import PairSpec
from disco.tables.phase import Here, TablePhase
from disco.tables.rows import prompts_frame
from disco.tables.workers import OnRay


@dataclass
class BenchConfig:
    models: str = "embedded"
    selection: Selection = field(default_factory=Selection)  # the suite and which of its prompts
    fitting: Fitting = field(default_factory=Fitting)         # prompts longer than the context or budget
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
    cluster: ClusterConfig | None = None         # build the replay tables on a Ray cluster first

    def pair_spec(self) -> PairSpec:
        return PairSpec(self.models, self.engine, self.dtype, self.device, self.assistant_precision)


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
    picked = pick(cfg.selection)
    prompts = split_prompts(picked.prompts, cfg.split)
    if not prompts:
        raise BenchError(f"no prompt of the {cfg.split} split is in the selection")
    if cfg.holdout and not (split_prompts(prompts, "train") and split_prompts(prompts, "test")):
        raise BenchError("--holdout needs prompts of both splits (train and test) in the selection")
    specs = with_baseline(cfg.policies or default_grid())
    profile_name = cost_mod.check_profile(cfg.cost_profile)
    if profile_name != cost_mod.MEASURED and cfg.mode != "replay":
        raise BenchError(f"--cost-profile {profile_name} applies to --mode replay only (timed runs are measured "
                         "on this machine)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    phase = TablePhase(cfg.pair_spec(), cfg.fitting, cfg.cache_dir or cache.tables_dir(), cfg.max_new_tokens)
    ray, found = None, None
    if cfg.cluster is not None and cfg.mode in ("replay", "both") and pair is None:
        # a profile known without this machine's models: the workers fill the chains the rules reading it need
        known = ()
        if profile_name != cost_mod.MEASURED:
            try:
                known = (cost_mod.resolve(profile_name),)
            except cost_mod.CostProfileError as exc:  # e.g. a CSV of several precisions: the tables' is not known yet
                _log(f"the workers fill the chains of a free assistant only ({exc}); the rest is computed here")
                known = ()
        ray = OnRay(cfg.cluster, cfg.progress, _log)
        found = phase.using(ray).ensure(prompts, specs, known)
    if profile_name != cost_mod.MEASURED and pair is None:
        result = recost_cached(cfg, picked, prompts, specs, profile_name, phase, found, ray)
        if result is not None:
            return result
    pair = resolve_assistant(pair or load_pair(cfg.models, dtype=cfg.dtype, device=cfg.device, engine=cfg.engine),
                             cfg.assistant_precision, log=_log)
    with COMPUTE_LOCK:  # the models are this benchmark's alone while it runs (an app in this process waits)
        return _run_loaded(cfg, pair, picked, prompts, specs, profile_name, wall, phase.using(Here(pair, cfg.progress)),
                           ray)


def _run_loaded(cfg: BenchConfig, pair, picked: Picked, prompts: list[SuitePrompt], specs: list[Policy],
                profile_name: str, wall: float, phase: TablePhase, ray: OnRay | None = None) -> dict:
    meta = run_meta(cfg, picked, specs, cfg.mode, pair, time_tolerance_pct=100 * TIME_TOLERANCE)
    runs: list[dict] = []
    costs, theory = None, None
    drafts: list[dict] = []  # every replayed drafting iteration (acceptance by draft position)

    if cfg.mode in ("replay", "both"):
        t0 = time.perf_counter()
        done = phase.ensure(prompts, specs)
        meta["tables_seconds"] = time.perf_counter() - t0
        if ray is not None:
            meta["ray"] = ray.describe()
    else:
        done = phase.encode(prompts)
    tables, prompts, rows = done.tables, done.prompts, done.rows
    _prompt_counts(meta, rows)
    if not prompts:
        raise BenchError("every selected prompt is too long for the context or the prompt budget (see --long-prompts)")
    encoded = {p.id: phase.ids(p) for p in prompts}

    if cfg.mode in ("replay", "both"):
        # costs are measured after the tables (models warm) and right before the timed runs, so that the
        # validation compares prediction and measurement taken under the same conditions
        kmax = deepest_draft(specs)

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
        runs += _timed(cfg, pair, prompts, phase.encoder, encoded, tables, runs, costs, meta)

    meta["wall_seconds"] = time.perf_counter() - wall
    return write_reports(cfg.out, pd.DataFrame(runs), meta, theory, drafts=pd.DataFrame(drafts),
                         prompts=prompts_frame(rows))


def _profile_costs(cfg: BenchConfig, pair, meta: dict) -> CostModel | None:
    """This machine's cached cost profile for the pair and engine, as the app's races use it (None without one)."""
    prof = profiles.latest(cfg.models, pair)
    if prof is None or not prof.precisions:
        _log("no cost profile of this machine for this engine yet (python -m disco profile): the timed runs carry no "
             "quiet-cost check")
        return None
    precision = meta.get("assistant_precision")
    meta["quiet_costs"] = f"profile {prof.measured_at}"
    return prof.cost_model_near(precision)


def _prompt_counts(meta: dict, rows: list[dict]) -> None:
    """What the report says of the prompts: how many were used, cut and skipped, and the skipped ones' reasons."""
    meta["prompts_used"] = sum(r["status"] != "skipped" for r in rows)
    meta["prompts_cut"] = sum(r["status"] == "cut" for r in rows)
    meta["prompts_skipped"] = [{"id": r["prompt_id"], "reason": r["reason"]} for r in rows if r["status"] == "skipped"]


def _timed(cfg: BenchConfig, pair, prompts, encoder, encoded, tables, runs, costs, meta) -> list[dict]:
    """Timed runs of the best settings (the train prompts' best on the test prompts with ``--holdout``)."""
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
    if costs is None:  # timed only: this machine's profile costs the quiet check (and the cost-reading rules)
        costs = _profile_costs(cfg, pair, meta)
    warm_up(pair, encoded[timed_prompts[0].id])
    t0 = time.perf_counter()
    out, records = [], []
    for j, p in enumerate(_progress(timed_prompts, len(timed_prompts), "timed", cfg.progress)):
        ref = tables[p.id].reference_for(cfg.max_new_tokens) if p.id in tables else None
        rows, recs = timed_prompt(pair, p, encoded[p.id], timed_specs, cfg.max_new_tokens, meta, cfg.reps, ref,
                                  cfg.peer, order_offset=j, costs=costs)
        out += rows
        records += recs
        if other is not None:  # right after this prompt's lanes, so both engines meet the machine alike
            out += engine_rows(other, p, encoder.ids_for(other, p), cfg.max_new_tokens, meta, cfg.reps, rows, ref)
    meta["timed_seconds"] = time.perf_counter() - t0
    if records:
        frame = pd.DataFrame(records)
        frame["confidences"] = frame["confidences"].map(lambda cs: " ".join(f"{c:.4f}" for c in cs))
        frame.to_csv(cfg.out / "timed_iterations.csv", index=False)
    return out


def _other_engine(cfg: BenchConfig, pair, meta: dict):
    """The pair on ``cfg.other_engine`` (loaded and warmed before anything is timed), or None."""
    if not cfg.other_engine or cfg.other_engine == pair.engine:
        return None
    _log(f"loading {cfg.models} on the {cfg.other_engine} engine too (its target alone is timed beside ours) ...")
    other = load_pair(cfg.models, dtype="auto", device=cfg.device, engine=cfg.other_engine, log=_log)
    other.warmup()
    meta["other_engine"] = {k: v for k, v in other.describe().items() if k != "assistant_precision"}
    return other


def engine_rows(other, prompt: SuitePrompt, ids: list[int], max_new_tokens: int, meta: dict, reps: int,
                rows: list[dict], reference: list[int] | None = None) -> list[dict]:
    """The target alone on the other engine (``ENGINE:autoregressive``), timed like our lanes; its speed-up is against
    this run's own autoregressive lane on the same prompt (so a value below 1 says how much slower that engine is)."""
    runs = [run_ours(other, ids, Autoregressive(), max_new_tokens) for _ in range(reps)]
    ours = next((r for r in rows if r["strategy"] == AUTOREGRESSIVE and r["implementation"] == "ours"), None)
    s = dict(runs[0]["summary"], seconds=statistics.median(r["summary"]["seconds"] for r in runs),
             decode_seconds=statistics.median(r["summary"]["decode_seconds"] for r in runs))
    # the same text as ours? (the torch engine runs the GGUF's weights dequantized to bf16: other numerics)
    same = runs[0]["output_ids"] == list(reference) if reference is not None else None
    return [run_row(prompt, f"{other.engine}:{AUTOREGRESSIVE}", "timed", other.engine, s, None,
                    ours["seconds"] if ours else math.nan, meta, prompt_tokens=len(ids), reps=reps, same_as_ours=same,
                    engine=other.engine, dtype=other.dtype_name)]
