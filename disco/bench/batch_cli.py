"""The command line of the batch-size work: ``bench --batch`` (the study over replay tables) and ``profile --batch``
(batched pass costs on llama.cpp, and ``--live``: the batched replay checked against live batched decoding)."""

from __future__ import annotations

import sys

import pandas as pd

from disco import options
from disco.bench import batch_live, batch_profile, machine_profile
from disco.bench.batch import BATCHES, RATES, BatchStudy, default_settings
from disco.bench.batch_run import run_batch_bench
from disco.costs import model as cost_model
from disco.costs.batched import check_batch, grid_from_rows
from disco.costs import roofline_fit
from disco.costs.model import CostProfileError
from disco.replay.layouts import LAYOUTS
from disco.tables.phase import TablePhase
from disco.bench.analysis import REFERENCE_SETTING
from disco.bench.run import run_bench
from disco.machine import flags_line
from disco.models import llama, load_resolved
from disco.policies import STATIC_KS


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_options(parser) -> None:
    """``bench``'s batch-size options (the batched replay over the replay tables; disco.bench.batch)."""
    g = parser.add_argument_group("batch sizes (the batched replay over the replay tables; disco.bench.batch)")
    g.add_argument("--batch", type=options.number_list(int), default=None, metavar="B,...",
                   help="replay the settings as B concurrent sequences under continuous batching (e.g. 1,2,4,8,16,32,64): "
                        "writes batch.csv, batch_answer.csv, batch_schedules.json, batch.md")
    g.add_argument("--layouts", default=None, metavar="NAME,...", help="verification layouts (default all five)")
    g.add_argument("--arrival-rates", default=None, metavar="RATE,...",
                   help="Poisson arrivals at the largest B: requests/s, or a share of the saturated rate as 0.8x "
                        "(default 0.5x,0.8x,0.95x)")
    g.add_argument("--batch-settings", default=None, metavar="SPEC,...",
                   help="settings raced in batches (default: the target alone, static K, thresholds at KMAX 20, sglang:3, "
                        "batchstop:20, free:threshold:0.4:20; free:SPEC drafts to the batch's depth)")
    g.add_argument("--batch-contexts", type=options.number_list(int), default=None, metavar="C,...",
                   help="tokens cached before each prompt (e.g. 0,4096,16384: a prefix every pass reads, none "
                        "prefills; acceptance stays the tables'): the answer per context length (default 0)")
    g.add_argument("--batch-requests", type=options.positive, default=None,
                   help="requests per stream (default max(48, 6 B))")
    g.add_argument("--batch-seeds", type=options.positive, default=None, help="seeded streams per point (default 3)")
    g.add_argument("--drafter", choices=["assistant", "head"], default=None,
                   help="head: a what-if drafter that costs one target layer per token (EAGLE/MTP-like), with the "
                        "assistant's acceptance (default assistant)")


BATCH_ONLY = ("layouts", "arrival_rates", "batch_settings", "batch_contexts", "batch_requests", "batch_seeds", "drafter")


def check_alone(args) -> None:
    """A batch option given without ``--batch``: one line (it would do nothing)."""
    alone = [n for n in BATCH_ONLY if getattr(args, n) is not None]
    if alone and args.batch is None:
        raise options.UsageError(f"--{alone[0].replace('_', '-')} goes with --batch")


def cmd_batch(args, cfg) -> int:
    def listed(text, default):
        return tuple(x.strip() for x in text.split(",") if x.strip()) if text else tuple(default)

    study = BatchStudy(batches=tuple(args.batch or BATCHES), layouts=listed(args.layouts, LAYOUTS),
                       rates=listed(args.arrival_rates, RATES),
                       settings=listed(args.batch_settings, default_settings(args.static_ks or STATIC_KS)),
                       requests=args.batch_requests or 0, seeds=args.batch_seeds or 3,
                       drafter=args.drafter or "assistant", contexts=tuple(args.batch_contexts or (0,)))
    result = run_batch_bench(cfg, study, run_bench)
    ans = result["answer"]
    print(f"wrote {cfg.out}/: " + ", ".join(sorted(p.name for p in result["files"].values())))
    for layout in ans["layout"].unique()[:1]:
        for _, a in ans[ans["layout"] == layout].iterrows():
            at = f" context {a.context}" if ans["context"].nunique() > 1 or a.context else ""
            print(f"{layout}{at} B={a.batch}: best static {a.best_static} {a.best_static_speedup:.2f}x | best threshold "
                  f"{a.best_threshold} {a.best_threshold_speedup:.2f}x | {REFERENCE_SETTING} {a.reference_speedup:.2f}x"
                  f" | batch stop {a.batchstop_speedup:.2f}x (test split)")
    return 0


def profile_batch(args) -> int:
    """``profile --batch``: batched pass costs (disco.bench.batch_profile), printed as a table and written to --csv."""
    try:
        batches = sorted({check_batch(b) for b in args.batch})
    except ValueError as exc:
        raise options.UsageError(f"--batch: {exc}") from None
    contexts = sorted(set(args.contexts or batch_profile.CONTEXTS))
    most = batch_profile.N_BATCH // max(batch_profile.KS)
    if max(batches) > most:
        raise options.UsageError(f"--batch: at most {most} (a pass of B x {max(batch_profile.KS)} tokens must fit the "
                                 f"{batch_profile.N_BATCH}-token batch profile --batch feeds, llama.cpp's n_batch)")
    if any(not 1 <= c <= batch_profile.N_BATCH - 32 for c in contexts):
        raise options.UsageError(f"--contexts: each must be between 1 and {batch_profile.N_BATCH - 32} tokens")
    for b in args.live or ():
        if not 1 <= b <= len([x for x in args.prompts.split(",") if x.strip()]):
            raise options.UsageError(f"--live {b}: each must be between 1 and the number of --prompts")
    pair = load_resolved(args.models, args.dtype, args.device, args.assistant_precision, log=_log, engine=args.engine)
    if args.live and pair.engine != "llamacpp":
        raise options.UsageError("--live decodes in one llama.cpp batch: use it with --engine llamacpp")
    rows, identity = batch_profile.measure(pair, batches, contexts, reps=args.reps)
    if args.csv:
        batch_profile.write_csv(rows, args.csv)
    runner = (f"llama.cpp {llama.kernels()}" if pair.engine == "llamacpp"
              else f"torch {pair.dtype_name} on {pair.device_name}")  # the threads: in flags_line
    print(f"batched passes on {flags_line()} ({runner}), median of {args.reps}; ms per pass")
    print("| layout | role | context | B | " + " | ".join(f"k={k}" for k in batch_profile.KS) + " |")
    print("|---|---|---|---|" + "---|" * len(batch_profile.KS))
    for key in sorted({(r["layout"], r["role"], r["context"], r["batch"]) for r in rows if r["kind"] == "step"}):
        cells = {r["tokens"]: r["ms"] for r in rows if r["kind"] == "step" and (r["layout"], r["role"], r["context"],
                                                                                 r["batch"]) == key}
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(f"{cells.get(k, float('nan')):.1f}"
                                                                         for k in batch_profile.KS) + " |")
    for layout, (same, diff) in identity.items():
        print(f"{layout}: batched rows {'bit-identical to' if same else f'differ from (max |d logit| {diff:.3g})'} "
              "each sequence fed alone")
    if args.live:
        live_check(args, pair, rows, identity)
    return 0


def live_check(args, pair, rows, identity) -> None:
    """``profile --batch --live``: the batched replay's prediction (priced by the rows just measured) beside live
    batched decoding of suite prompts (disco.bench.batch_live)."""
    prompts = machine_profile.suite_prompts(tuple(x.strip() for x in args.prompts.split(",") if x.strip()))
    if max(args.live) > len(prompts):
        raise options.UsageError(f"--live {max(args.live)} needs that many --prompts (got {len(prompts)})")
    phase = TablePhase.here(pair, args.max_new_tokens, None)
    ids = [phase.ids(p) for p in prompts]
    out = []
    for layout in identity:
        grid = grid_from_rows([dict(r, batch=str(r["batch"])) for r in rows], "profile --batch", layout=layout)
        for b in args.live:
            out += batch_live.check(pair, ids, grid, b, layout, max_new_tokens=args.max_new_tokens, reps=args.reps)
    frame = pd.DataFrame(out)
    print("\nlive batched decoding vs the batched replay's prediction (ms of passes; error = predicted / live - 1)")
    print(frame.round(1).to_string(index=False))
    if args.csv:
        frame.to_csv(args.csv.with_name(args.csv.stem + "_live.csv"), index=False)


def fit_roofline(path) -> int:
    """``profile --fit-roofline CSV``: roofline:this fitted to measured batched passes; the error on passes left out
    (each split of ``disco.costs.roofline_fit``), then the fit on every pass kept for ``roofline:this``."""
    rows = cost_model.csv_rows(path)
    if not rows or "batch" not in rows[0]:
        raise options.UsageError(f"--fit-roofline: {path} has no batch column (write one with profile --batch --csv)")
    points = roofline_fit.points_from_rows(rows)
    print(f"roofline:this fitted to {len(points)} measured passes of {path} ({flags_line()})")
    print("| held out | fitted on | tested on | median error | worst error |\n|---|---|---|---|---|")
    for split in roofline_fit.SPLITS:
        try:
            r = roofline_fit.held_out_report(points, split)
        except CostProfileError as exc:
            print(f"| {split} | - | - | {exc} | |")
            continue
        print(f"| {split} | {len(r['train'])} | {len(r['test'])} | {r['median_abs_pct']:.1f} % | "
              f"{r['worst_abs_pct']:.1f} % |")
    factors, report = roofline_fit.fit(points)
    saved = roofline_fit.save_fit(factors, report, str(path))
    print(f"all passes: median {report['median_abs_pct']:.1f} %, worst {report['worst_abs_pct']:.1f} %; factors "
          + ", ".join(f"{k} {v:.3g}" for k, v in factors.items()) + (f"; kept in {saved}" if saved else ""))
    print("What transfers from a CPU to a GPU: the shapes, bytes, FLOPs and pass counts. What does not: every "
          "efficiency, kernel and host time (a GPU's are its own; see docs/hardware.md).")
    return 0
