"""The seed's question under sampling: is τ = 0.4 with at most 20 draft tokens still almost optimal when the
target samples? (``python -m disco sampling``)

Replay is exact only for greedy decoding, so sampling is measured by live runs: the settings greedy replay ranks
best on the suite's *train* prompts (best static K, best threshold), ``threshold:0.4:20`` and the target alone are
run with ``do_sample`` on the *test* prompts, at each temperature, with several seeds. Each run's cost is then
taken two ways:
  * modelled: its own records (target pass sizes, assistant passes) costed by the per-pass costs measured on this
    machine (``CostModel.iteration_ms``, what replay charges), and by any ``flat:C`` profile (a GPU-like regime);
    this removes the machine's timing noise, not the sampling's randomness: the passes are the run's own;
  * wall: the run's own clock, for reference.
Speed-up = the target alone's ms per token / the setting's ms per token on the same prompt, temperature and seed
(the two sample different texts of possibly different lengths, so per token). Geometric mean over the test
prompts per seed; the spread is across seeds.

Checked in ``tests/bench/test_sampling_study.py``: a greedy run's modelled time equals replay's for the same
setting (the costing is replay's), and the study's numbers are recomputed from its rows.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from disco import cache, options, suites
from disco.bench.analysis import REFERENCE_SETTING, best_settings, geomean, summarize_runs
from disco.bench.runs import environment, replay_rows
from disco.costs import measure as cost_measure, model as cost_mod
from disco.costs.model import CostModel
from disco.decode.live import Decoder
from disco.decode.race import lane_pair
from disco.decode.settings import DecodeSettings
from disco.errors import BenchError
from disco.models.turns import COMPUTE_LOCK
from disco.policies import AUTOREGRESSIVE, KMAXES, STATIC_KS, TAUS, Policy, parse_strategy
from disco.policies.grids import default_grid
from disco.replay.run import replay_many
from disco.suites import SuitePrompt
from disco.tables import cluster, fitting as prompt_fit
from disco.tables.fitting import PromptSkipped
from disco.tables.identity import PairSpec
from disco.tables.phase import Here, TablePhase
from disco.tables.workers import OnRay

TEMPERATURES = (0.7, 1.0)
SEEDS = 3
ROW_COLUMNS = ["prompt_id", "kind", "split", "strategy", "temperature", "seed", "new_tokens", "iterations",
               "drafted", "accepted", "acceptance_rate", "target_tokens", "assistant_passes", "wall_ms"]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def modelled_ms(records, costs: CostModel) -> float:
    """A run's time under ``costs``, from its own iteration records."""
    return costs.records_ms(records)


def run_one(pair, ids: list[int], policy: Policy, max_new_tokens: int, temperature: float, seed: int, top_p: float,
            costs: dict[str, CostModel]) -> dict:
    settings = DecodeSettings(max_new_tokens=max_new_tokens, sample=True, temperature=temperature, top_p=top_p,
                              seed=seed)
    lane = lane_pair(pair, policy)  # its @precision assistant, as in a race
    reads = policy.needs_costs or policy.reads_costs  # costaware / disco read this machine's measured costs
    start = time.perf_counter()
    decoder = Decoder(lane, list(ids), policy, settings, costs=costs.get("measured") if reads else None).run()
    wall = (time.perf_counter() - start) * 1000.0
    recs = decoder.records
    drafted = sum(r.lookahead for r in recs)
    accepted = sum(r.accepted for r in recs)
    row = {"strategy": policy.spec, "temperature": temperature, "seed": seed, "new_tokens": len(decoder.output_ids),
           "iterations": len(recs), "drafted": drafted, "accepted": accepted,
           "acceptance_rate": accepted / drafted if drafted else math.nan,
           "target_tokens": sum(r.target_tokens for r in recs), "assistant_passes": sum(r.draft_calls for r in recs),
           "wall_ms": wall}
    for name, model in costs.items():
        row[f"ms_{name}"] = modelled_ms(recs, model)
    return row


def run_study(pair, prompts: list[SuitePrompt], policies: list[Policy], max_new_tokens: int, costs: dict[str, CostModel],
              temperatures=TEMPERATURES, seeds: int = SEEDS, top_p: float = 1.0, progress=None,
              phase: TablePhase | None = None) -> pd.DataFrame:
    """Every (prompt, temperature, seed, policy) run once, the target alone included; one row each. ``phase``
    (``disco.tables.phase.TablePhase``) gives each prompt's ids (default: the pair's, without a cache)."""
    phase = phase or TablePhase.here(pair, max_new_tokens, None)
    specs = [p.spec for p in policies]
    if AUTOREGRESSIVE not in specs:
        policies = [parse_strategy(AUTOREGRESSIVE), *policies]
    rows = []
    total = len(prompts) * len(temperatures) * seeds * len(policies)
    for p in prompts:
        ids = phase.ids(p)
        for t in temperatures:
            for seed in range(seeds):
                for policy in policies:
                    row = run_one(pair, ids, policy, max_new_tokens, t, seed, top_p, costs)
                    rows.append({"prompt_id": p.id, "kind": p.kind, "split": p.split, **row})
                    if progress is not None:
                        progress(len(rows), total)
    return pd.DataFrame(rows)


def speedups(rows: pd.DataFrame, cost: str) -> pd.DataFrame:
    """Per run: the target alone's ms per token over the run's, same prompt, temperature and seed (``cost``: a
    profile name, or ``wall``)."""
    col = "wall_ms" if cost == "wall" else f"ms_{cost}"
    per_token = rows.assign(ms_per_token=rows[col] / rows["new_tokens"].clip(lower=1))
    keys = ["prompt_id", "temperature", "seed"]
    base = per_token[per_token["strategy"] == AUTOREGRESSIVE].set_index(keys)["ms_per_token"]
    out = per_token[per_token["strategy"] != AUTOREGRESSIVE].copy()
    out["speedup"] = [base.get(tuple(k), math.nan) / v for k, v in zip(out[keys].itertuples(index=False),
                                                                      out["ms_per_token"])]
    return out


def summary(rows: pd.DataFrame, costs: list[str]) -> pd.DataFrame:
    """Per cost, temperature and strategy: the geomean speed-up over prompts for each seed, their mean, min and max,
    the acceptance, and the share of the best strategy's mean (the seed's "almost optimal")."""
    out = []
    for cost in costs:
        sp = speedups(rows, cost)
        for (t, spec), part in sp.groupby(["temperature", "strategy"], sort=False):
            per_seed = [geomean(g["speedup"]) for _, g in part.groupby("seed")]
            out.append({"cost": cost, "temperature": t, "strategy": spec, "seeds": len(per_seed),
                        "prompts": part["prompt_id"].nunique(), "speedup_mean": sum(per_seed) / len(per_seed),
                        "speedup_min": min(per_seed), "speedup_max": max(per_seed),
                        "acceptance": part["accepted"].sum() / max(1, part["drafted"].sum())})
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    best = frame.groupby(["cost", "temperature"])["speedup_mean"].transform("max")
    frame["of_best"] = frame["speedup_mean"] / best
    return frame


def summary_md(table: pd.DataFrame, meta: dict) -> str:
    """The report: one table per cost (modelled on this machine, flat profiles, wall), strategies × temperatures."""
    lines = [f"# The seed's question under sampling: {meta.get('models')} ({meta.get('engine')})", "",
             f"Command: `{meta.get('command')}`  ",
             f"Machine: {meta.get('machine')}  ",
             "Settings chosen by greedy replay on the train prompts, per cost profile: "
             + "; ".join(f"{cost}: {', '.join(f'`{s}`' for s in specs)}"
                         for cost, specs in (meta.get("chosen_by_cost") or {"": meta["chosen"]}).items())
             + f" (and `{REFERENCE_SETTING}`, the seed's); "
             f"run with sampling on {meta['prompts']} test prompts, {meta['max_new_tokens']} new tokens, top-p "
             f"{meta['top_p']:g}, seeds 0..{meta['seeds'] - 1} at each temperature. Speed-up = the target alone's ms "
             "per token / the setting's, same prompt, temperature and seed; geometric mean over prompts per seed, "
             "mean [min–max] over seeds; \"of best\" = share of the best setting's mean at that temperature.", ""]
    names = {"measured": "modelled with this machine's measured pass costs", "wall": "wall clock of the runs"}
    for cost, part in table.groupby("cost", sort=False):
        temps = sorted(part["temperature"].unique())
        lines += [f"## {names.get(cost, f'modelled with the `{cost}` profile')}", "",
                  "| strategy | " + " | ".join(f"T = {t:g}: speed-up, of best, acceptance" for t in temps) + " |",
                  "|---|" + "---|" * len(temps)]
        for spec in dict.fromkeys(part["strategy"]):
            cells = []
            for t in temps:
                r = part[(part["strategy"] == spec) & (part["temperature"] == t)]
                if r.empty:
                    cells.append("—")
                    continue
                r = r.iloc[0]
                cells.append(f"{r['speedup_mean']:.2f}x [{r['speedup_min']:.2f}–{r['speedup_max']:.2f}], "
                             f"{100 * r['of_best']:.0f} %, {r['acceptance']:.2f}")
            mark = " (the seed's)" if spec == REFERENCE_SETTING else (
                " (chosen here)" if spec in (meta.get("chosen_by_cost") or {}).get(cost, ()) else "")
            lines.append(f"| `{spec}`{mark} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def choice_grid() -> list[Policy]:
    """What greedy replay ranks on the train prompts to choose the study's settings: static K and τ × KMAX."""
    return default_grid(STATIC_KS, TAUS, KMAXES, heuristic=(), oracle=False, kinds=())


def _choose(prompts, costs: dict[str, CostModel], log, phase: TablePhase) -> dict[str, list[str]]:
    """Per cost profile, the best static K and the best threshold of greedy replay on ``prompts`` (the train split);
    the tables come from (and go to) the phase's cache, so a benchmark's tables are reused."""
    max_new_tokens = phase.max_new_tokens
    grid = choice_grid()
    tables = []
    for i, p in enumerate(prompts):
        log(f"greedy replay on the train prompts: {p.id} ({i + 1}/{len(prompts)})")
        try:
            tables.append((p, phase.prepare(p, grid)[0]))
        except PromptSkipped as exc:
            log(f"skipped {exc}")
    chosen = {}
    for name, model in costs.items():
        runs = []
        for p, table in tables:
            runs += replay_rows(p, table, replay_many(table, grid, max_new_tokens, model),
                                {"max_new_tokens": max_new_tokens})
        best = best_settings(summarize_runs(pd.DataFrame(runs)))
        chosen[name] = list(dict.fromkeys(s for s in (best.get("best_static"), best.get("best_threshold")) if s))
    return chosen


def _fitting(prompts: list[SuitePrompt], phase: TablePhase, log) -> list[SuitePrompt]:
    """The prompts the length rule keeps (the others named once)."""
    kept = []
    for p in prompts:
        try:
            phase.ids(p)
            kept.append(p)
        except PromptSkipped as exc:
            log(f"skipped {exc}")
    if not kept:
        raise BenchError("no test prompt fits the context or the prompt budget (see --long-prompts)")
    return kept


@dataclass(frozen=True)
class SamplingConfig:
    """What one sampling study runs (checked): the pair, the prompts, the settings (None: chosen by greedy replay on
    the train prompts), temperatures, seeds and the flat cost profiles besides the measured one."""

    spec: PairSpec
    selection: object              # suites.selection_from_args
    fitting: object                # the length rule (disco.tables.fitting)
    cache_dir: Path
    max_new_tokens: int
    temperatures: tuple[float, ...]
    flats: tuple[str, ...]
    strategies: tuple[Policy, ...] | None
    seeds: int = SEEDS
    top_p: float = 1.0
    ray: object = None             # a Ray cluster's config (disco.tables.cluster), or None
    progress: bool = True
    command: str = "python -m disco sampling"

    @classmethod
    def from_args(cls, args) -> "SamplingConfig":
        """The command's arguments, checked (one line for a bad one)."""
        temps = list(dict.fromkeys(args.temperatures))
        if any(not 0 < t <= 5 for t in temps):
            raise BenchError("--temperatures: each must be in (0, 5]")
        if not 0 < args.top_p <= 1:
            raise BenchError(f"--top-p must be in (0, 1], got {args.top_p}")
        flats = {cost_mod.check_profile(name) for name in (args.cost_profile or ["flat:0.05"])}
        if any(not name.startswith("flat:") for name in flats):
            raise BenchError("--cost-profile: give flat:C profiles here (the measured one is always included)")
        options.check_out_dir(args.out)
        strategies = [parse_strategy(s) for s in args.strategies.split(",") if s.strip()] if args.strategies else None
        if strategies and any(p.greedy_only for p in strategies):
            raise BenchError("the oracle needs greedy decoding; it has no place in a sampling study")
        if strategies is not None and not any(p.drafts for p in strategies):
            raise BenchError("--strategies: give at least one setting that drafts (the target alone is always run)")
        return cls(PairSpec.from_args(args), suites.selection_from_args(args), prompt_fit.fitting_from_args(args),
                   args.cache_dir or cache.tables_dir(), args.max_new_tokens, tuple(temps), tuple(sorted(flats)),
                   tuple(strategies) if strategies is not None else None, args.seeds, args.top_p,
                   cluster.config_from_args(args), not args.no_progress,
                   "python -m disco sampling " + " ".join(getattr(args, "argv", [])))


@dataclass
class SamplingResult:
    """A study's rows (one per run), its summary and its metadata."""

    rows: pd.DataFrame
    table: pd.DataFrame
    meta: dict


def run(config: SamplingConfig, log=_log) -> SamplingResult:
    """The study: tables for the choice (on Ray if asked), the settings chosen on the train prompts (unless given),
    then live sampled runs on the test prompts, costed under the measured and the flat profiles."""
    picked = suites.pick(config.selection)
    train, test = suites.split_prompts(picked.prompts, "train"), suites.split_prompts(picked.prompts, "test")
    if not test or (config.strategies is None and not train):
        raise BenchError("the selected prompts need both a train and a test split (or give --strategies)")
    phase = TablePhase(config.spec, config.fitting, config.cache_dir, config.max_new_tokens)
    if config.ray is not None and config.strategies is None:  # the train prompts' tables, for the choice of settings
        phase.using(OnRay(config.ray, config.progress, log)).ensure(train, choice_grid())
    pair = config.spec.load(log=log)
    start = time.perf_counter()
    temps = list(config.temperatures)
    with COMPUTE_LOCK:
        phase = phase.using(Here(pair, progress=False))
        test = _fitting(test, phase, log)
        measured = cost_measure.suite_costs(pair, [phase.ids(p) for p in test], 20, reps=2)
        costs = {"measured": measured, **{name: cost_mod.resolve(name, step_ms=measured.target_ms(1))
                                          for name in config.flats}}
        by_cost = ({"given": [p.spec for p in config.strategies]} if config.strategies
                   else _choose(train, costs, log, phase))
        chosen = list(dict.fromkeys([s for specs in by_cost.values() for s in specs] +
                                    ([] if config.strategies else [REFERENCE_SETTING])))
        log(f"sampling {', '.join(chosen)} on {len(test)} test prompts, T = {', '.join(f'{t:g}' for t in temps)}, "
            f"{config.seeds} seeds")
        bar = None
        if config.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(test) * len(temps) * config.seeds * (len(chosen) + 1), desc="sampled runs",
                       file=sys.stderr, dynamic_ncols=True)
        rows = run_study(pair, test, [parse_strategy(s) for s in chosen], config.max_new_tokens, costs, temps,
                         config.seeds, config.top_p, progress=(lambda done, total: bar.update(1)) if bar else None,
                         phase=phase)
        if bar is not None:
            bar.close()
    meta = environment(pair)
    meta.update(command=config.command, chosen=chosen, chosen_by_cost=by_cost,
                prompts=len(test), **{k: v for k, v in picked.describe().items() if k != "prompts"},
                prompts_skipped=[{"id": i, "reason": r} for i, r in phase.encoder.skipped.items()],
                max_new_tokens=config.max_new_tokens, top_p=config.top_p, seeds=config.seeds, temperatures=temps,
                costs={k: v.to_dict() for k, v in costs.items()}, wall_seconds=time.perf_counter() - start)
    return SamplingResult(rows, summary(rows, [*costs, "wall"]), meta)


def write(result: SamplingResult, out: Path) -> list[str]:
    """The study's files in ``out``: its rows, its summary (CSV and markdown) and its metadata."""
    out.mkdir(parents=True, exist_ok=True)
    result.rows.to_csv(out / "sampling.csv", index=False)
    result.table.to_csv(out / "sampling_summary.csv", index=False)
    (out / "sampling.md").write_text(summary_md(result.table, result.meta), encoding="utf-8")
    (out / "meta.json").write_text(json.dumps(options.json_safe(result.meta), indent=2), encoding="utf-8")
    return ["sampling.csv", "sampling_summary.csv", "sampling.md", "meta.json"]


def cmd_sampling(args) -> int:
    """``python -m disco sampling``: config -> study -> files, and one line per temperature."""
    result = run(SamplingConfig.from_args(args))
    print(f"wrote {args.out}/: {', '.join(write(result, args.out))}")
    table = result.table
    best = table[(table["cost"] == "measured")].sort_values("speedup_mean", ascending=False)
    for t, part in best.groupby("temperature"):
        top = part.iloc[0]
        ref = part[part["strategy"] == REFERENCE_SETTING]
        print(f"T={t:g}: best {top['strategy']} {top['speedup_mean']:.2f}x; {REFERENCE_SETTING} "
              + (f"{ref.iloc[0]['speedup_mean']:.2f}x ({100 * ref.iloc[0]['of_best']:.0f} % of best)" if not ref.empty
                 else "not run") + " (modelled with this machine's pass costs)")
    return 0
