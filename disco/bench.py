"""Benchmarks: static vs dynamic lookahead on a prompt suite, by exact replay and by timed runs.

``python -m disco bench`` (or ``python -m disco.bench``):
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

This module runs the benchmark and its command line; the parts live by concept: ``disco.suite`` (prompts),
``disco.costs`` (per-pass costs and cost profiles), ``disco.runs`` (the runs table, replay of one prompt),
``disco.peer`` (timed runs and transformers' generate), ``disco.analysis`` (speed-ups, theory, validation),
``disco.heatmap``, ``disco.report`` (the output files) and ``disco.sweep_service`` (the Sweep tab's engine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from disco import costs as cost_mod
from disco.costs import CostModel
from disco.policies import StrategyError, parse_strategy
from disco.replay import AUTOREGRESSIVE, KMAXES, STATIC_KS, TAUS, ReplayError, default_grid, replay_many
from disco.suite import (
    BenchError, DEFAULT_SUITE, SPLITS, SuitePrompt, filter_prompts, load_suite, pick_prompts, split_prompts,
)
from disco.runs import environment, prepare_table, replay_rows
from disco.report import report_only, write_reports
from disco.peer import timed_prompt, warm_up
from disco.analysis import REFERENCE_SETTING, TIME_TOLERANCE, best_settings, summarize_runs, theory_frame

EXIT_USAGE = 2


# the whole benchmark


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
    specs: tuple[str, ...] = ()
    timed_strategies: tuple[str, ...] = ()
    timed_prompts: int | None = 6
    prompts: str | None = None
    split: str = "all"
    reps: int = 1
    calibration_reps: int = 2
    cache_dir: Path | None = None
    cost_profile: str = "measured"
    peer: bool = True
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


def default_timed_strategies(best: dict) -> list[str]:
    specs = [AUTOREGRESSIVE, best.get("best_static") or "static:5", best.get("best_threshold"), REFERENCE_SETTING,
             ADAPTIVE_REFERENCE]
    return list(dict.fromkeys(s for s in specs if s))


def run_bench(cfg: BenchConfig, pair=None) -> dict:
    """Run the benchmark and write every output into ``cfg.out``. Returns paths and headline numbers."""
    from disco.models import load_pair

    wall = time.perf_counter()
    prompts = split_prompts(filter_prompts(load_suite(cfg.suite), cfg.prompts), cfg.split)
    if not prompts:
        raise BenchError(f"no prompt of the {cfg.split} split matches --prompts")
    specs = list(dict.fromkeys(cfg.specs or default_grid()))
    for s in specs + list(cfg.timed_strategies):
        parse_strategy(s)  # fail fast, before any model work
    if AUTOREGRESSIVE not in specs:
        specs.insert(0, AUTOREGRESSIVE)
    profile_name = cost_mod.check_profile(cfg.cost_profile)
    if profile_name != cost_mod.MEASURED and cfg.mode != "replay":
        raise BenchError(f"--cost-profile {profile_name} applies to --mode replay only (timed runs are measured "
                         "on this machine)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    if profile_name != cost_mod.MEASURED and pair is None:
        result = recost_cached(cfg, prompts, specs, profile_name)
        if result is not None:
            return result
    from disco.models import resolve_assistant

    pair = resolve_assistant(pair or load_pair(cfg.models, dtype=cfg.dtype, device=cfg.device),
                             cfg.assistant_precision, log=_log)
    meta = environment(pair)
    meta.update(command=cfg.command, suite=str(cfg.suite or DEFAULT_SUITE.name), max_new_tokens=cfg.max_new_tokens,
                mode=cfg.mode, grid_size=len(specs), time_tolerance_pct=100 * TIME_TOLERANCE)
    from disco.race import encode_prompt

    encoded = {p.id: encode_prompt(pair, p.prompt, p.chat, cfg.max_new_tokens) for p in prompts}
    runs: list[dict] = []
    summary = pd.DataFrame()
    costs = None
    tables = {}
    theory = None
    kmax = max([getattr(parse_strategy(s), "k", 1) for s in specs] + [1])

    if cfg.mode in ("replay", "both"):
        cache_dir = cfg.cache_dir or (cfg.out / "tables")
        t0 = time.perf_counter()
        for p in _progress(prompts, len(prompts), "replay tables", cfg.progress):
            tables[p.id], _ = prepare_table(pair, p, specs, cfg.max_new_tokens, cache_dir)
        meta["tables_seconds"] = time.perf_counter() - t0
        # costs are measured after the tables (models warm) and right before the timed runs, so that the
        # validation compares prediction and measurement taken under the same conditions

        def measure() -> CostModel:
            _log(f"calibrating per-pass costs on {pair.describe()['models']} ({meta['dtype']}, {meta['device']}) ...")
            return cost_mod.suite_costs(pair, list(encoded.values()), kmax, reps=cfg.calibration_reps)

        t0 = time.perf_counter()
        costs = cost_mod.resolve(profile_name, measured=measure, precision=meta.get("assistant_precision"))
        meta["calibration_seconds"] = time.perf_counter() - t0
        meta["cost_profile"] = profile_name
        runs += replay_grid(tables, prompts, specs, cfg.max_new_tokens, costs, meta)
        summary = summarize_runs(pd.DataFrame(runs))
        meta["best"] = best_settings(summary)
        theory = theory_frame(meta["alpha"], costs.cost_ratio, costs, summary)

    if cfg.mode in ("timed", "both"):
        timed_specs = list(cfg.timed_strategies) or default_timed_strategies(meta.get("best", {}))
        if AUTOREGRESSIVE not in timed_specs:
            timed_specs.insert(0, AUTOREGRESSIVE)
        timed_prompts = pick_prompts(prompts, cfg.timed_prompts)
        meta["timed_strategies"] = timed_specs
        meta["prompts_timed"] = len(timed_prompts)
        warm_up(pair, encoded[timed_prompts[0].id])
        t0 = time.perf_counter()
        records = []
        for j, p in enumerate(_progress(timed_prompts, len(timed_prompts), "timed", cfg.progress)):
            ref = tables[p.id].reference_for(cfg.max_new_tokens) if p.id in tables else None
            rows, recs = timed_prompt(pair, p, timed_specs, cfg.max_new_tokens, meta, cfg.reps, ref, cfg.peer,
                                      order_offset=j, costs=costs)
            runs += rows
            records += recs
        meta["timed_seconds"] = time.perf_counter() - t0
        if records:
            frame = pd.DataFrame(records)
            frame["confidences"] = frame["confidences"].map(lambda cs: " ".join(f"{c:.4f}" for c in cs))
            frame.to_csv(cfg.out / "timed_iterations.csv", index=False)

    meta["wall_seconds"] = time.perf_counter() - wall
    return write_reports(cfg.out, pd.DataFrame(runs), meta, theory)


def replay_grid(tables: dict, prompts: list[SuitePrompt], specs: list[str], max_new_tokens: int, costs: CostModel,
                meta: dict) -> list[dict]:
    """Every spec replayed on every prompt's table under ``costs`` (the runs table's replay rows); records in
    ``meta`` what the report needs of it: the costs, the prompts replayed, α (the assistant's first draft equals
    the target's token, over all positions) and c."""
    meta["costs"] = costs.to_dict()
    runs: list[dict] = []
    hits = total = 0
    for p in prompts:
        table = tables[p.id]
        runs += replay_rows(p, table, replay_many(table, specs, max_new_tokens, costs), meta)
        h, n = table.first_token_agreement(max_new_tokens)
        hits, total = hits + h, total + n
    meta.update(prompts_replayed=len(prompts), alpha=hits / total if total else math.nan, cost_ratio=costs.cost_ratio)
    return runs


def _cached_table(cache_dir: Path, prompt: SuitePrompt, cfg: BenchConfig):
    """The one cached table of ``prompt`` that matches the run's models (and dtype / assistant precision when
    they are given), or None when there is none or several could match."""
    from disco.replay import ReplayTable, cached_table_paths

    found = []
    for path in cached_table_paths(cache_dir, prompt.id):
        try:
            table = ReplayTable.from_dict(json.loads(path.read_text()), path)
        except (OSError, ValueError, KeyError, TypeError, ReplayError):
            continue
        m = table.meta
        if m.get("models") != cfg.models or not table.covers(cfg.max_new_tokens):
            continue
        if cfg.dtype != "auto" and m.get("dtype") != cfg.dtype:
            continue
        if cfg.assistant_precision != "auto" and m.get("assistant_precision", "model") != cfg.assistant_precision:
            continue
        found.append(table)
    kinds = {(t.meta.get("dtype"), t.meta.get("assistant_precision", "model")) for t in found}
    if len(kinds) > 1:
        _log(f"{prompt.id}: cached tables for {sorted(kinds)}; give --dtype and --assistant-precision to pick one")
        return None
    return found[0] if found else None


def recost_cached(cfg: BenchConfig, prompts: list[SuitePrompt], specs: list[str], profile_name: str) -> dict | None:
    """Replay every spec from cached tables under a non-measured cost profile, without loading the models.

    Returns None (the caller then loads the models) when a prompt has no usable table or a table lacks a chain
    token some spec needs."""
    cache_dir = cfg.cache_dir or (cfg.out / "tables")
    tables = {p.id: _cached_table(cache_dir, p, cfg) for p in prompts}
    missing = [i for i, t in tables.items() if t is None]
    if missing:
        _log(f"no cached replay table for {', '.join(missing)} in {cache_dir}; loading the models")
        return None
    first = next(iter(tables.values())).meta
    meta = environment(None, {k: first.get(k) for k in ("models", "target", "assistant", "dtype", "device")})
    meta["assistant_precision"] = first.get("assistant_precision", "model")
    meta.update(command=cfg.command, suite=str(cfg.suite or DEFAULT_SUITE.name), max_new_tokens=cfg.max_new_tokens,
                mode="replay", grid_size=len(specs), cost_profile=profile_name, models_loaded=False)
    costs = cost_mod.resolve(profile_name, precision=meta["assistant_precision"])
    start = time.perf_counter()
    try:
        runs = replay_grid(tables, prompts, specs, cfg.max_new_tokens, costs, meta)
    except ReplayError as exc:
        _log(f"the cached tables do not cover this grid ({exc}); loading the models")
        return None
    meta["replay_seconds"] = meta["wall_seconds"] = time.perf_counter() - start
    _log(f"replayed {len(specs)} settings on {len(prompts)} cached tables under {profile_name} "
         f"in {meta['replay_seconds']:.1f} s (models not loaded)")
    return write_reports(cfg.out, pd.DataFrame(runs), meta)


# command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BenchError(f"{message} (see {self.prog} --help)")


def _int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _list(text: str, cast) -> list:
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m disco bench",
                description="Static vs dynamic speculation lookahead on a prompt suite: exact greedy replay of a grid, "
                            "timed runs of the best settings, and transformers' assisted generation as the peer.")
    p.add_argument("--models", default=os.environ.get("DISCO_MODELS", "embedded"),
                   help="tiny, embedded (default), or TARGET::ASSISTANT")
    p.add_argument("--suite", default=None, help=f"prompt suite (.json/.jsonl; default {DEFAULT_SUITE.name})")
    p.add_argument("--prompts", default=None, help="comma-separated prompt ids or kinds to keep")
    p.add_argument("--max-new-tokens", type=_int_arg, default=None, help="tokens per prompt (default 64; quick 32)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench-out/MODELS)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke run: tiny pair, 3 prompts, both modes including the peer")
    p.add_argument("--mode", choices=["replay", "timed", "both"], default=None,
                   help="replay (default; exact greedy replay of the grid), timed (real runs + transformers peer), "
                        "or both (adds the validation of replay against the timed runs; the --quick default)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: chosen by timing the passes that matter on this machine (cached)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--assistant-precision", choices=["auto", "model", "int8"],
                   default=os.environ.get("DISCO_ASSISTANT_PRECISION", "auto"),
                   help="the assistant's weights for every lane: model, int8 (dynamic int8, CPU) or auto (calibrated)")
    p.add_argument("--static-ks", type=lambda t: _list(t, int), default=None, help=f"default {','.join(map(str, STATIC_KS))}")
    p.add_argument("--taus", type=lambda t: _list(t, float), default=None, help="default 0.05,0.1,...,0.95")
    p.add_argument("--kmaxes", type=lambda t: _list(t, int), default=None, help=f"default {','.join(map(str, KMAXES))}")
    p.add_argument("--strategy", action="append", dest="extra", default=[], metavar="SPEC",
                   help="extra strategy to replay (repeatable)")
    p.add_argument("--timed-strategies", default=None,
                   help="comma-separated specs to time (default: autoregressive, best static K, best threshold, "
                        "threshold:0.4:20, adaptive:0.4:20)")
    p.add_argument("--timed-prompts", type=_int_arg, default=None,
                   help="how many prompts to time, spread over the kinds (default 6; quick: all)")
    p.add_argument("--split", choices=SPLITS, default="all",
                   help="replay only the suite's train or test prompts (split by prompt, alternately within each kind); "
                        "with all (default) the report adds a train/test table: each kind's setting chosen on train, "
                        "its speed-up on test")
    p.add_argument("--reps", type=_int_arg, default=1, help="A B repetitions per prompt and strategy (median kept)")
    p.add_argument("--calibration-reps", type=_int_arg, default=2, help="timings per pass size (median kept)")
    p.add_argument("--cache-dir", type=Path, default=None, help="replay tables cache (default OUT/tables)")
    p.add_argument("--cost-profile", default="measured", metavar="PROFILE",
                   help="how replay turns passes into time: measured (this machine, default), flat:C (every target pass "
                        "one step, an assistant pass C steps: a GPU with a tiny draft), or a per-pass CSV from "
                        "`python -m disco profile --csv`. Other than measured: --mode replay only, and cached tables "
                        "are re-costed in seconds without loading the models")
    p.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    p.add_argument("--threads", type=_int_arg, default=None, help="torch intra-op threads")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild summary.csv/md, heatmaps, theory, validation from OUT/runs.csv and meta.json")
    return p


def config_from_args(args, argv: list[str]) -> BenchConfig:
    quick = args.quick
    models = "tiny" if quick and "--models" not in " ".join(argv) else args.models
    specs = default_grid(args.static_ks or STATIC_KS, args.taus or TAUS, args.kmaxes or KMAXES)
    specs += list(args.extra)
    for tau in args.taus or ():
        if not 0 <= tau <= 1:
            raise BenchError(f"--taus: {tau} is not in [0, 1]")
    timed = tuple(s.strip() for s in args.timed_strategies.split(",") if s.strip()) if args.timed_strategies else ()
    out = args.out or Path("bench-out") / ("quick" if quick else "".join(c if c.isalnum() else "_" for c in models)[:40])
    prompts = args.prompts
    if quick and prompts is None:
        suite = load_suite(args.suite)
        prompts = ",".join(p.id for p in pick_prompts(suite, 3))
    return BenchConfig(
        models=models, suite=args.suite, max_new_tokens=args.max_new_tokens or (32 if quick else 64), out=out,
        mode=args.mode or ("both" if quick else "replay"), dtype=args.dtype, device=args.device,
        assistant_precision=args.assistant_precision, specs=tuple(specs), timed_strategies=timed,
        timed_prompts=args.timed_prompts or (None if quick else 6), prompts=prompts, split=args.split, reps=args.reps,
        calibration_reps=args.calibration_reps,
        cache_dir=args.cache_dir, cost_profile=args.cost_profile, peer=not args.no_peer, progress=not args.no_progress,
        command=_env_prefix() + "python -m disco bench " + " ".join(argv),
    )


def _env_prefix() -> str:
    """The environment that changes what a bench run measures, written before its command (reproducible)."""
    keep = [f"{name}={os.environ[name]}" for name in ("DISCO_CLASSIFIER", "ONEDNN_MAX_CPU_ISA") if os.environ.get(name)]
    return " ".join(keep) + " " if keep else ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from disco.engine import InputError
    from disco.models import ModelLoadError
    from disco.precision import PrecisionError

    try:
        args = build_parser().parse_args(argv)
        cfg = config_from_args(args, argv)
        if args.report_only:
            result = report_only(cfg.out)
            print(f"rewrote the reports in {cfg.out}/")
            return 0
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        elif cfg.models == "tiny":
            torch.set_num_threads(1)  # tiny models gain nothing from threads; on a busy machine they thrash
        result = run_bench(cfg)
    except (BenchError, InputError, StrategyError, ModelLoadError, ReplayError, PrecisionError,
            cost_mod.CostProfileError) as exc:
        print(f"disco bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"disco bench: error: {exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("disco bench: error: interrupted (replay tables computed so far are cached; re-run to resume)", file=sys.stderr)
        return 130
    meta = result["meta"]
    best = meta.get("best", {})
    lines = [f"wrote {cfg.out}/: " + ", ".join(sorted(p.name for p in result["files"].values()))]
    if best:
        lines.append(f"best static {best.get('best_static')} {best.get('best_static_speedup', math.nan):.2f}x | "
                     f"{REFERENCE_SETTING} {best.get('reference_speedup', math.nan):.2f}x | best threshold "
                     f"{best.get('best_threshold')} {best.get('best_threshold_speedup', math.nan):.2f}x | oracle "
                     f"{best.get('best_oracle_speedup', math.nan):.2f}x (replay, geomean)")
    v = result["validation"]
    if v.get("checked"):
        lines.append(f"validation: {v['exact']}/{v['checked']} runs with exactly the predicted iterations and target "
                     f"passes; time error {v['time_error_pct_total']:+.1f}% total, per strategy within "
                     f"±{v['tolerance_pct']:.0f}%: {'yes' if v['time_ok'] else 'no'}")
    if meta.get("ours_over_hf_total") == meta.get("ours_over_hf_total"):
        lines.append(f"ours / transformers seconds: {meta['ours_over_hf_total']:.3f}; "
                     f"engine overhead {meta.get('overhead_pct_mean', math.nan):.2f}%")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
