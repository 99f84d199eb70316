"""Command line: ``python -m disco {generate,profile,models,train,bench}``, one parser stack.

The root parser is here; each area adds its own subcommands (``disco.models.commands``, ``disco.bench.commands``)
with the shared pieces of ``disco.options``; ``generate`` (a race on one prompt) is the root's own. Every user
mistake is a ``disco.errors.UserError``: one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from disco import limits, options
from disco.costs import profile
from disco.decode.divergence import RULE, short
from disco.decode.race import build_policies, run_all
from disco.decode.settings import DecodeSettings
from disco.errors import UserError
from disco.models import load_resolved
from disco.options import UsageError
from disco.policies import AUTOREGRESSIVE, DEFAULT_STRATEGIES, Policy, parse_strategy, policy_kinds
from disco.text import fmt

EXIT_USAGE = 2
AUTO = "auto"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="run strategies side by side on one prompt and print their summaries")
    options.add_models(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    p.add_argument("--strategy", action="append", dest="strategies", metavar="SPEC",
                   help="repeatable: " + ", ".join(cls.template() for cls in policy_kinds()) + ", or auto "
                        "(this machine's recommended setting, from `python -m disco profile`); add @model, @int8 or @q4_0 "
                        f"to pick a lane's assistant (default: {' '.join(DEFAULT_STRATEGIES)}). Every kind: "
                        + "; ".join(f"{cls.kind}: {cls.summary}" for cls in policy_kinds()))
    p.add_argument("--max-new-tokens", type=options.integer, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=options.number, default=1.0)
    p.add_argument("--top-p", type=options.number, default=1.0)
    p.add_argument("--seed", type=options.integer, default=0)
    options.add_numerics(p)
    p.add_argument("--csv", type=Path, help="write the per-iteration trace of all strategies here")
    p.add_argument("--tokens-csv", type=Path, help="write the per-token trace of all strategies here")
    p.add_argument("--json", action="store_true", help="print one JSON object per strategy instead of a table")
    p.set_defaults(func=cmd_generate)


def resolve_lanes(strategies: list[str], pair, models: str) -> list[Policy]:
    """The lanes as policies (parsed once, here), an ``auto`` lane replaced by this machine's recommended setting
    (from the cached profile)."""
    lanes: list[Policy] = []
    for spec in strategies:
        if spec.strip() == AUTO:
            prof = profile.latest(models, pair)
            policy = profile.auto_policy(prof)
            _log(f"auto = {policy.spec}{'@' + policy.assistant_precision if policy.assistant_precision else ''} "
                 f"(this machine's profile, {prof.measured_at})")
        else:
            policy = parse_strategy(spec)
        if all(p.spec != policy.spec for p in lanes):  # auto = autoregressive where speculation does not pay: once
            lanes.append(policy)
    return lanes


JSON_FIELDS = ["strategy", "text", "new_tokens", "seconds", "tokens_per_s", "speedup", "target_calls", "draft_calls",
               "acceptance_rate", "mean_lookahead", "ttft_ms", "decode_tokens_per_s", "iterations", "drafted", "accepted",
               "overhead_pct", "identical_to_autoregressive", "divergence", "finish_reason", "models", "target", "assistant",
               "dtype", "device", "assistant_precision", "prompt_tokens", "chat", "max_new_tokens", "sample", "temperature", "top_p", "seed",
               "engine", "kernels"]


def kernels(info: dict) -> str:
    """Which kernels ran the models: llama.cpp's exact (batch-invariant) ones or its defaults, or torch's dtype."""
    if info.get("engine") == "llamacpp":
        variant = f" ({info['cpu_variant']})" if info.get("cpu_variant") else ""  # the CPU variant: its rows are its own
        return ("llama.cpp exact" if info.get("exact") else "llama.cpp default") + variant
    return f"torch {info.get('dtype', '?')}"


def _diverged(div: dict | None) -> str:
    if not div:
        return "NO"
    return f"{'near-tie' if div['kind'] == 'near-tie' else 'MISMATCH'}@{div['position']}"


def _cell(value, spec: str) -> str:
    return fmt(value, spec, dash="-")


def print_table(summaries: list[dict], out=None) -> None:
    out = out or sys.stdout
    head = ["strategy", "assistant", "tokens", "seconds", "tok/s", "speed-up", "target", "draft", "accept", "mean K", "TTFT ms", "identical"]
    rows = []
    for s in summaries:
        ident = s["identical_to_autoregressive"]
        rows.append([s["strategy"], s.get("assistant_precision", "-"), str(s["new_tokens"]), _cell(s["seconds"], ".2f"), _cell(s["tokens_per_s"], ".2f"),
                     _cell(s["speedup"], ".2f") + ("x" if not math.isnan(s["speedup"]) else ""),
                     str(s["target_calls"]), str(s["draft_calls"]), _cell(s["acceptance_rate"], ".2f"),
                     _cell(s["mean_lookahead"], ".2f"), _cell(s["ttft_ms"], ".0f"),
                     "-" if ident is None else ("yes" if ident else _diverged(s.get("divergence")))])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(head), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print(line(r), file=out)
    diverged = [s for s in summaries if s.get("divergence")]
    for s in diverged:
        print(f"{s['strategy']}: {short(s['divergence'])}", file=out)
    if diverged:
        print(f"({RULE}; a near-tie is bf16 rounding of an almost-tied choice, a mismatch is a bug)", file=out)


def cmd_generate(args) -> int:
    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read prompt file {args.prompt_file}: "
                             f"{exc.strerror if isinstance(exc, OSError) else exc}") from None
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise UsageError("give a prompt with --prompt TEXT or --prompt-file PATH")
    strategies = args.strategies or list(DEFAULT_STRATEGIES)
    # everything that can be checked without the models is checked before loading them (same checks as the app)
    prompt = limits.check_prompt(prompt)
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                              top_p=args.top_p, seed=limits.check_seed(args.seed))
    settings.validate()
    build_policies([s for s in strategies if s.strip() != AUTO] or [AUTOREGRESSIVE])
    options.check_writable(args.csv)
    options.check_writable(args.tokens_csv)

    pair = load_resolved(args.models, args.dtype, args.device, args.assistant_precision, log=_log, engine=args.engine)
    final = run_all(pair, prompt, resolve_lanes(strategies, pair, args.models), settings, chat=args.chat)
    summaries = final.summaries()
    if args.csv:
        final.export_iterations().to_csv(args.csv, index=False)
    if args.tokens_csv:
        final.export_tokens().to_csv(args.tokens_csv, index=False)
    if args.json:
        run = {"engine": pair.describe().get("engine", "torch"), "kernels": kernels(pair.describe())}
        for s in summaries:
            row = {**run, **s}
            print(json.dumps({k: options.json_safe(row.get(k)) for k in JSON_FIELDS}, ensure_ascii=False))
        return 0
    meta = final.meta
    print(f"models: {meta['target']} + {meta['assistant']}  ({meta['dtype']}, {meta['device']}); "
          f"prompt {meta['prompt_tokens']} tokens; {'sampling' if settings.sample else 'greedy'}")
    texts = {s["text"] for s in summaries}
    if len(texts) == 1:
        print(f"\n--- output (all strategies) ---\n{summaries[0]['text']}\n")
    else:
        for s in summaries:
            print(f"\n--- {s['strategy']} ---\n{s['text']}")
        print()
    print_table(summaries)
    return 0


def build_parser() -> options.Parser:
    from disco.bench import commands as bench_commands
    from disco.models import commands as model_commands

    parser = options.Parser(prog="python -m disco", description="DISCO Lab: static vs dynamic speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=options.Parser)
    add_generate(sub)
    model_commands.add_commands(sub)
    bench_commands.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    who = "disco bench" if argv[:1] == ["bench"] else "disco"
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv[1:]
        return args.func(args)
    except UserError as exc:
        print(f"{who}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        print(f"{who}: {exc or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        sys.stderr.close()
        return 0
