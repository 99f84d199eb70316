"""The benchmark area's subcommands, parsed here: ``python -m disco bench``, ``profile``, ``train`` and ``sampling``
(run by their studies' modules: ``disco.bench.run``, ``disco.bench.train``, ``disco.bench.sampling``). Each declares its
arguments with the shared pieces of ``disco.options``; the root parser (``disco.cli``) adds them."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

from disco import options, suites
from disco.bench import batch_cli
from disco.bench.analysis import REFERENCE_SETTING
from disco.bench.run import BenchConfig, run_bench
from disco.tables import cluster, fitting as prompt_fit
from disco.costs.profile import DEFAULT_PROMPTS, DEFAULT_TOKENS
from disco.errors import BenchError, InputError
from disco.machine import flags_line
from disco.models import llama, load_resolved
from disco.policies import KMAXES, STATIC_KS, TAUS, parse_strategy
from disco.policies.export import ENGINES
from disco.policies.grids import default_grid, unique


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_commands(sub) -> None:
    from disco.bench import sampling, train

    add_bench(sub)
    add_profile(sub)
    add_train(sub, train)
    add_sampling(sub, sampling)


# ---------------------------------------------------------------------------------------------
# bench


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark and sweep: exact replay of a grid, timed runs, transformers as the peer",
                       description="Static vs dynamic speculation lookahead on a prompt suite: exact greedy replay of a "
                                   "grid, timed runs of the best settings, and transformers' assisted generation as "
                                   "the peer.")
    options.add_models(p)
    suites.add_arguments(p)
    prompt_fit.add_arguments(p)
    cluster.add_arguments(p)
    p.add_argument("--max-new-tokens", type=options.positive, default=None, help="tokens per prompt (default 64; quick 32)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench-out/MODELS)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke run: tiny pair, 3 prompts, both modes including the peer")
    p.add_argument("--mode", choices=["replay", "timed", "both"], default=None,
                   help="replay (default; exact greedy replay of the grid), timed (real runs + transformers peer), "
                        "or both (adds the validation of replay against the timed runs; the --quick default)")
    options.add_numerics(p, "the assistant's weights for every lane: model, int8 (dynamic int8, CPU) or auto "
                            "(calibrated)")
    p.add_argument("--static-ks", type=options.number_list(int), default=None, help=f"default {','.join(map(str, STATIC_KS))}")
    p.add_argument("--taus", type=options.number_list(float), default=None, help="default 0.05,0.1,...,0.95")
    p.add_argument("--kmaxes", type=options.number_list(int), default=None, help=f"default {','.join(map(str, KMAXES))}")
    p.add_argument("--strategy", action="append", dest="extra", default=[], metavar="SPEC",
                   help="extra strategy to replay (repeatable)")
    p.add_argument("--timed-strategies", default=None,
                   help="comma-separated specs to time (default: autoregressive, best static K, best threshold, "
                        "threshold:0.4:20, adaptive:0.4:20)")
    p.add_argument("--timed-prompts", type=options.positive, default=None,
                   help="how many prompts to time, spread over the kinds (default 6; quick: all)")
    p.add_argument("--split", choices=suites.SPLITS, default="all",
                   help="replay only the suite's train or test prompts (split by question, alternately within each kind, "
                        "or by --holdout-kinds); with all (default) the report adds a train/test table: each kind's "
                        "setting chosen on train, its speed-up on test")
    p.add_argument("--holdout", action="store_true",
                   help="--mode both: time the settings that replay ranks best on the train prompts, on the test prompts "
                        "only (so the timed figures are held out from the choice)")
    p.add_argument("--reps", type=options.positive, default=1, help="A B repetitions per prompt and strategy (median kept)")
    p.add_argument("--calibration-reps", type=options.positive, default=2, help="timings per pass size (median kept)")
    p.add_argument("--cache-dir", type=Path, default=None, help="replay tables cache (default: the one cache, $DISCO_CACHE/tables)")
    p.add_argument("--cost-profile", default="measured", metavar="PROFILE",
                   help="how replay turns passes into time: measured (this machine, default), flat:C (every target pass "
                        "one step, an assistant pass C steps: a GPU with a tiny draft), or a per-pass CSV from "
                        "`python -m disco profile --csv`. Other than measured: --mode replay only, and cached tables "
                        "are re-costed in seconds without loading the models")
    p.add_argument("--no-peer", action="store_true", help="skip the engine's peer (transformers' generate, llama.cpp's "
                                                          "own programs)")
    p.add_argument("--other-engine", choices=["torch", "llamacpp"], default=None,
                   help="timed mode: also time the target alone on this engine, right after each timed prompt's lanes "
                        "(rows ENGINE:autoregressive), so one run compares the two engines")
    p.add_argument("--threads", type=options.positive, default=None, help="torch intra-op threads")
    p.add_argument("--no-progress", action="store_true")
    batch_cli.add_options(p)
    p.add_argument("--report-only", action="store_true",
                   help="rebuild the reports from OUT/runs.csv and meta.json (a batch study's from OUT/batch.csv)")
    p.set_defaults(func=cmd_bench)


def config_from_args(args, argv: list[str]) -> BenchConfig:
    quick = args.quick
    models = "tiny" if quick and "--models" not in " ".join(argv) else args.models
    for tau in args.taus or ():
        if not 0 <= tau <= 1:
            raise BenchError(f"--taus: {tau} is not in [0, 1]")
    # the grid and every typed spec become policies here, once: nothing below parses a spec again
    policies = default_grid(args.static_ks or STATIC_KS, args.taus or TAUS, args.kmaxes or KMAXES)
    policies = unique(policies + [parse_strategy(s) for s in args.extra])
    timed = [parse_strategy(s) for s in args.timed_strategies.split(",") if s.strip()] if args.timed_strategies else []
    mode = args.mode or ("both" if quick else "replay")
    if args.holdout and (mode != "both" or args.split != "all"):
        raise BenchError("--holdout needs --mode both and --split all (settings chosen on train, timed on test)")
    if args.other_engine:
        from disco.models.load import resolve_engine

        if mode == "replay":
            raise BenchError("--other-engine times the target alone: use it with --mode timed or both")
        if resolve_engine(args.engine, models, args.device, args.dtype) == args.other_engine:
            raise BenchError(f"--other-engine {args.other_engine} is this run's own engine")
        resolve_engine(args.other_engine, models, args.device, "auto")  # a clear error now, not after the replay
    out = args.out or Path("bench-out") / ("quick" if quick else "".join(c if c.isalnum() else "_" for c in models)[:40])
    selection = suites.selection_from_args(args)
    if quick and args.prompts is None and args.suite is None and args.limit is None:
        builtin = suites.load_suite()
        selection = dataclasses.replace(selection, prompts=",".join(p.id for p in suites.pick_prompts(
            list(builtin.prompts), 3)))
    ray = cluster.config_from_args(args)
    if ray is not None and mode == "timed":
        raise BenchError("--ray builds replay tables: use it with --mode replay or both")
    return BenchConfig(
        models=models, selection=selection, fitting=prompt_fit.fitting_from_args(args), cluster=ray,
        max_new_tokens=args.max_new_tokens or (32 if quick else 64), out=out,
        mode=mode, dtype=args.dtype, device=args.device, engine=args.engine,
        assistant_precision=args.assistant_precision, policies=tuple(policies), timed_policies=tuple(timed),
        timed_prompts=args.timed_prompts or (None if quick else 6), split=args.split, reps=args.reps,
        calibration_reps=args.calibration_reps,
        cache_dir=args.cache_dir, cost_profile=args.cost_profile, peer=not args.no_peer, other_engine=args.other_engine,
        holdout=args.holdout,
        progress=not args.no_progress,
        command=_env_prefix() + "python -m disco bench " + " ".join(argv),
    )


def _env_prefix() -> str:
    """The environment that changes what a bench run measures, written before its command (reproducible)."""
    keep = [f"{name}={os.environ[name]}" for name in ("DISCO_CLASSIFIER", "ONEDNN_MAX_CPU_ISA") if os.environ.get(name)]
    return " ".join(keep) + " " if keep else ""


def cmd_bench(args) -> int:
    argv = args.argv
    cfg = config_from_args(args, argv)
    batch_cli.check_alone(args)
    if args.batch is not None:
        return batch_cli.cmd_batch(args, cfg)
    if args.report_only:
        from disco.bench.batch_run import rewrite_batch_reports
        from disco.bench.report import report_only

        if (cfg.out / "runs.csv").exists() or not (cfg.out / "batch.csv").exists():
            report_only(cfg.out)
        if (cfg.out / "batch.csv").exists():  # a batch study's folder: its reports too
            rewrite_batch_reports(cfg.out)
        print(f"rewrote the reports in {cfg.out}/")
        return 0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    elif cfg.models == "tiny":
        torch.set_num_threads(1)  # tiny models gain nothing from threads; on a busy machine they thrash
    try:
        result = run_bench(cfg)
    except OSError as exc:
        raise BenchError(f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}") from None
    except KeyboardInterrupt:
        raise KeyboardInterrupt("interrupted (replay tables computed so far are cached; re-run to resume)") from None
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
        peer = "llama.cpp" if meta.get("engine") == "llamacpp" else "transformers"
        lines.append(f"ours / {peer} seconds: {meta['ours_over_hf_total']:.3f}; "
                     f"engine overhead {meta.get('overhead_pct_mean', math.nan):.2f}%")
    print("\n".join(lines))
    return 0


# ---------------------------------------------------------------------------------------------
# profile


def add_profile(sub) -> None:
    p = sub.add_parser("profile", help="measure and print this machine's cost profile and recommended lookahead")
    options.add_models(p)
    options.add_numerics(p)
    p.add_argument("--prompts", default=",".join(DEFAULT_PROMPTS),
                   help=f"comma-separated suite prompt ids for the acceptance replay (default {','.join(DEFAULT_PROMPTS)})")
    p.add_argument("--max-new-tokens", type=options.integer, default=DEFAULT_TOKENS, help="tokens replayed per prompt")
    p.add_argument("--reps", type=options.integer, default=3, help="timings per pass size (median kept)")
    p.add_argument("--refresh", action="store_true", help="measure again even if this machine's profile is cached")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.add_argument("--csv", type=Path, help="also write the per-pass costs here (role, precision, kind, tokens, ms)")
    p.add_argument("--kernels", action="store_true",
                   help="llama.cpp engine: also price its exact kernels against llama.cpp's defaults with llama-bench, "
                        "and show the memory floor of a pass (about a minute once; cached)")
    p.add_argument("--variants", action="store_true",
                   help="with --kernels: also price every CPU variant of llama.cpp's kernels built here that this CPU "
                        "runs (about 40 s each, not cached; DISCO_LLAMA_CPU_VARIANT picks the one the app runs)")
    p.add_argument("--batch", type=options.number_list(int), default=None, metavar="B,...",
                   help="measure passes over B sequences x k tokens (k 1-16) on the target and the assistant in each "
                        "multi-sequence layout of the engine (llama.cpp: streams and unified; torch: padded), and "
                        "whether rows stay bit-identical to batch 1; "
                        "--csv writes them with batch, context and layout columns (a --cost-profile for bench --batch)")
    p.add_argument("--contexts", type=options.number_list(int), default=None, metavar="C,...",
                   help="with --batch: cached tokens per sequence before each pass (default 64,256)")
    p.add_argument("--fit-roofline", type=Path, default=None, metavar="CSV",
                   help="fit roofline:this to the passes of a profile --batch CSV and report its error on passes it did "
                        "not see (small to large, one context to another, target to assistant); no model is loaded")
    p.add_argument("--live", type=options.number_list(int), default=None, metavar="B,...",
                   help="with --batch, llama.cpp engine: then decode B of --prompts in one batch (target alone, static:4, "
                        "threshold:0.4:20; --reps times) and set the batched replay's prediction beside it")
    p.set_defaults(func=cmd_profile)


def print_profile(prof, out=None) -> None:
    out = out or sys.stdout
    w = lambda line="": print(line, file=out)
    w(f"machine: {flags_line(prof.key)}; torch {prof.key['torch']}")
    w(f"models: {prof.key['models']} ({prof.dtype}, {prof.key['device']}); measured {prof.measured_at} in {prof.seconds:.0f} s")
    if prof.decision:
        w(f"numerics: chose {prof.decision['dtype']} + {prof.decision['assistant_precision']} assistant: "
          f"{prof.decision['reason']}")
    w("\ntarget pass cost against tokens verified (on a ~40-token cache)")
    t1 = prof.target_ms[1]
    cells = [f"{n:>2}: {ms:6.0f} ms {ms / t1:4.2f}x" for n, ms in sorted(prof.target_ms.items())]
    for i in range(0, len(cells), 4):
        w("  " + "   ".join(cells[i:i + 4]))
    w("\nassistant step and acceptance")
    for p in prof.precisions:
        w(f"  {p:5s}  {prof.assistant_ms[p][1]:6.0f} ms a step  c = {prof.cost_ratio(p):.2f}  "
          f"acceptance alpha = {prof.acceptance.get(p, math.nan):.2f}")
    w("\nspeed-up over autoregressive: replay on " + ", ".join(prof.prompts) + f" ({prof.max_new_tokens} tokens, "
      "geomean) and Leviathan's prediction with the measured verification cost")
    head = f"  {'assistant':9s} {'best static K':>20s} {'best threshold':>26s} {REF_LABEL:>22s} {'Leviathan best K':>18s}"
    w(head)
    for p, e in prof.recommended.get("by_precision", {}).items():
        w(f"  {p:9s} {e.get('static', '-'):>13s} {e.get('static_speedup', math.nan):5.2f}x "
          f"{e.get('threshold', '-'):>19s} {e.get('threshold_speedup', math.nan):5.2f}x "
          f"{e.get('reference_speedup', math.nan):21.2f}x {('K=' + str(e.get('leviathan_k'))):>11s} "
          f"{e.get('leviathan_speedup', math.nan):5.2f}x")
    rec = prof.recommended
    if "auto" in rec:
        verdict = "speculation pays here" if rec.get("speculation_pays") else "speculation does not pay here"
        w(f"\nrecommended (the `auto` lane): {rec['auto']}  {rec['auto_speedup']:.2f}x ({verdict})")
        if not rec.get("speculation_pays") and rec.get("best_speculative"):
            w(f"best speculative setting: {rec['best_speculative']}  {rec['best_speculative_speedup']:.2f}x")
    for settings in prof.take_away():
        w(f"\n{settings['setting']} in your engine" + (" (the target alone)" if settings["setting"] == "autoregressive"
                                                        else ""))
        for engine in ENGINES:
            e = settings[engine]
            tag = "" if e["exact"] else " (nearest)"
            w(f"  {engine}{tag}: {e['text'] or e['note']}")
            if e["note"] and e["text"]:
                w(f"    {e['note']}")


REF_LABEL = REFERENCE_SETTING


def cmd_profile(args) -> int:
    from disco.bench import machine_profile
    from disco.costs.model import write_csv

    prompts = tuple(x.strip() for x in args.prompts.split(",") if x.strip())
    if not prompts:
        raise options.UsageError("--prompts: give at least one suite prompt id")
    machine_profile.suite_prompts(prompts)
    if not 1 <= args.max_new_tokens <= 512:
        raise options.UsageError(f"--max-new-tokens must be between 1 and 512, got {args.max_new_tokens}")
    if not 1 <= args.reps <= 20:
        raise options.UsageError(f"--reps must be between 1 and 20, got {args.reps}")
    options.check_writable(args.csv)
    if args.variants and not args.kernels:
        raise options.UsageError("--variants goes with --kernels")
    if (args.contexts or args.live) and not args.batch:
        raise options.UsageError("--contexts and --live go with --batch")
    if args.fit_roofline:
        return batch_cli.fit_roofline(args.fit_roofline)
    if args.batch:
        return batch_cli.profile_batch(args)
    pair = load_resolved(args.models, args.dtype, args.device, args.assistant_precision, log=_log, engine=args.engine)
    if args.kernels and getattr(pair, "engine", None) != "llamacpp":
        raise InputError("--kernels prices llama.cpp's kernels: use it with --engine llamacpp")
    prof = machine_profile.get(pair, args.models, refresh=args.refresh, prompts=prompts,
                               max_new_tokens=args.max_new_tokens, reps=args.reps, log=_log)
    if args.csv:
        write_csv(prof.cost_rows(), args.csv)
    kernels = None
    if args.kernels:
        from disco.bench import kernel_price

        kernels = kernel_price.get(pair.target_path, refresh=args.refresh, say=_log, pair=pair)
    if not args.json:  # printed before the variants are priced (minutes), so nothing measured waits on them
        print_profile(prof)
        if kernels:
            print("\n" + kernel_price.markdown(kernels), flush=True)
    variants = kernel_price.measure_variants(pair.target_path, args.reps, say=_log) if args.variants else {}
    if args.variants and not variants:
        _log("--variants: this llama.cpp build has one CPU backend linked in, no variants to price")
    if args.json:
        data = prof.to_dict() | ({"kernels": kernels, "kernels_summary": kernel_price.summary(kernels)} if kernels else {})
        data |= {"kernel_variants": variants} if variants else {}
        print(json.dumps(options.json_safe(data), ensure_ascii=False))
    elif variants:
        print("\n" + kernel_price.variants_markdown(variants, llama.kernels()))
    return 0


# ---------------------------------------------------------------------------------------------
# train and sampling (the studies' own modules run them)


def add_train(sub, train) -> None:
    p = sub.add_parser("train", help="train the DISCO classifier (disco:KMAX lanes) from replay tables")
    options.add_models(p)
    options.add_numerics(p)
    suites.add_arguments(p)
    prompt_fit.add_arguments(p)
    cluster.add_arguments(p)
    p.add_argument("--max-new-tokens", type=options.integer, default=48, help="tokens per prompt (default 48)")
    p.add_argument("--kmax", type=options.integer, default=20, help="deepest draft step sampled and the KMAX tuned for")
    p.add_argument("--cost-profile", default="measured", metavar="PROFILE",
                   help="costs the stop threshold is tuned under: measured (default), flat:C, or a profile CSV")
    p.add_argument("--cache-dir", type=Path, default=None, help="replay tables cache (default: the one cache)")
    p.add_argument("--out", type=Path, default=train.DEFAULT_WEIGHTS,
                   help=f"weights file (default {train.DEFAULT_WEIGHTS.name} in assets/)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=train.cmd_train)


def add_sampling(sub, sampling) -> None:
    p = sub.add_parser("sampling", help="the seed's question under sampling: live sampled runs of the settings greedy "
                                        "replay ranks best, several temperatures and seeds",
                       description=sampling.__doc__.split("\n\n")[0])
    options.add_models(p)
    options.add_numerics(p)
    suites.add_arguments(p)
    prompt_fit.add_arguments(p)
    cluster.add_arguments(p)
    p.add_argument("--max-new-tokens", type=options.positive, default=48, help="tokens per run (default 48)")
    p.add_argument("--temperatures", type=options.number_list(float), default=list(sampling.TEMPERATURES),
                   help="comma-separated (default 0.7,1)")
    p.add_argument("--top-p", type=options.number, default=1.0, help="nucleus sampling (default 1: off)")
    p.add_argument("--seeds", type=options.positive, default=sampling.SEEDS,
                   help=f"seeds per temperature (default {sampling.SEEDS})")
    p.add_argument("--strategies", default=None,
                   help="comma-separated specs to run (default: the best static K and best threshold of greedy replay "
                        "on the train prompts, and threshold:0.4:20)")
    p.add_argument("--cost-profile", action="append", default=[], metavar="flat:C",
                   help="also cost every run under this profile (repeatable; default flat:0.05)")
    p.add_argument("--out", type=Path, default=Path("bench-out/sampling"), help="output folder")
    p.add_argument("--cache-dir", type=Path, default=None, help="replay tables cache (default: the one cache)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=sampling.cmd_sampling)
