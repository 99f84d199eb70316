"""Command line: ``python -m disco {generate,profile,models,train,bench}``.

Every user mistake ends as one line on stderr and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we want one line
        raise CliError(f"{message} (see {self.prog} --help)")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# generate


def _integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def add_generate(sub) -> None:
    from disco.policies import DEFAULT_STRATEGIES, policy_kinds

    p = sub.add_parser("generate", help="run strategies side by side on one prompt and print their summaries")
    p.add_argument("--models", default=os.environ.get("DISCO_MODELS", "embedded"),
                   help="tiny, embedded (default), or TARGET::ASSISTANT (local folders or hub ids)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    p.add_argument("--strategy", action="append", dest="strategies", metavar="SPEC",
                   help="repeatable: " + ", ".join(cls.template() for cls in policy_kinds()) + ", or auto "
                        "(this machine's recommended setting, from `python -m disco profile`); add @model or @int8 "
                        f"to pick a lane's assistant (default: {' '.join(DEFAULT_STRATEGIES)}). Every kind: "
                        + "; ".join(f"{cls.kind}: {cls.summary}" for cls in policy_kinds()))
    p.add_argument("--max-new-tokens", type=_integer, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=_float, default=1.0)
    p.add_argument("--top-p", type=_float, default=1.0)
    p.add_argument("--seed", type=_integer, default=0)
    add_numerics(p)
    p.add_argument("--csv", type=Path, help="write the per-iteration trace of all strategies here")
    p.add_argument("--tokens-csv", type=Path, help="write the per-token trace of all strategies here")
    p.add_argument("--json", action="store_true", help="print one JSON object per strategy instead of a table")
    p.set_defaults(func=cmd_generate)


def add_numerics(p) -> None:
    """--dtype, --device and --assistant-precision, shared by generate, profile and bench."""
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: chosen by timing the passes that matter on this machine (cached)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--assistant-precision", choices=["auto", "model", "int8"],
                   default=os.environ.get("DISCO_ASSISTANT_PRECISION", "auto"),
                   help="the assistant's weights: model (the pair's dtype), int8 (dynamic int8 Linear layers, CPU), or "
                        "auto (int8 where the calibration shows it faster); a lane's @model / @int8 overrides it")


def _check_writable(path: Path | None) -> None:
    if path is None:
        return
    target = path.expanduser().resolve()
    if target.is_dir():
        raise CliError(f"cannot write {path}: it is a folder; give a file name")
    if not target.parent.is_dir():
        raise CliError(f"cannot write {path}: folder {target.parent} does not exist")


def resolve_strategies(strategies: list[str], pair, models: str) -> list[str]:
    """Replace an ``auto`` lane by this machine's recommended setting (from the cached profile)."""
    if not any(s.strip() == "auto" for s in strategies):
        return strategies
    from disco import profile

    prof = profile.latest(models, pair)
    try:
        best = profile.resolve_auto("auto", prof)
    except profile.ProfileError as exc:
        raise CliError(str(exc)) from None
    _log(f"auto = {best} (this machine's profile, {prof.measured_at})")
    resolved = [best if s.strip() == "auto" else s for s in strategies]
    return list(dict.fromkeys(resolved))  # auto = autoregressive where speculation does not pay: run it once


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


JSON_FIELDS = ["strategy", "text", "new_tokens", "seconds", "tokens_per_s", "speedup", "target_calls", "draft_calls",
               "acceptance_rate", "mean_lookahead", "ttft_ms", "decode_tokens_per_s", "iterations", "drafted", "accepted",
               "overhead_pct", "identical_to_autoregressive", "divergence", "finish_reason", "models", "target", "assistant",
               "dtype", "device", "assistant_precision", "prompt_tokens", "chat", "max_new_tokens", "sample", "temperature", "top_p", "seed"]


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _diverged(div: dict | None) -> str:
    if not div:
        return "NO"
    return f"{'near-tie' if div['kind'] == 'near-tie' else 'MISMATCH'}@{div['position']}"


def print_table(summaries: list[dict], out=None) -> None:
    out = out or sys.stdout
    head = ["strategy", "assistant", "tokens", "seconds", "tok/s", "speed-up", "target", "draft", "accept", "mean K", "TTFT ms", "identical"]
    rows = []
    for s in summaries:
        ident = s["identical_to_autoregressive"]
        rows.append([s["strategy"], s.get("assistant_precision", "-"), str(s["new_tokens"]), _fmt(s["seconds"], ".2f"), _fmt(s["tokens_per_s"], ".2f"),
                     _fmt(s["speedup"], ".2f") + ("x" if not math.isnan(s["speedup"]) else ""),
                     str(s["target_calls"]), str(s["draft_calls"]), _fmt(s["acceptance_rate"], ".2f"),
                     _fmt(s["mean_lookahead"], ".2f"), _fmt(s["ttft_ms"], ".0f"),
                     "-" if ident is None else ("yes" if ident else _diverged(s.get("divergence")))])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(head), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print(line(r), file=out)
    from disco.divergence import RULE, short

    diverged = [s for s in summaries if s.get("divergence")]
    for s in diverged:
        print(f"{s['strategy']}: {short(s['divergence'])}", file=out)
    if diverged:
        print(f"({RULE}; a near-tie is bf16 rounding of an almost-tied choice, a mismatch is a bug)", file=out)


def _load(args):
    """The pair with its default assistant, as --models, --dtype, --device and --assistant-precision say."""
    from disco.models import load_pair, resolve_assistant
    from disco.precision import PrecisionError

    pair = load_pair(args.models, dtype=args.dtype, device=args.device, log=_log)
    try:
        return resolve_assistant(pair, args.assistant_precision, log=_log)
    except PrecisionError as exc:
        raise CliError(str(exc)) from None


def cmd_generate(args) -> int:
    from disco.engine import DecodeSettings
    from disco import limits
    from disco.models import load_pair
    from disco.policies import DEFAULT_STRATEGIES
    from disco.race import build_policies, run_all

    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read prompt file {args.prompt_file}: {exc.strerror if isinstance(exc, OSError) else exc}")
    elif args.prompt is not None:
        prompt = args.prompt
    else:
        raise CliError("give a prompt with --prompt TEXT or --prompt-file PATH")
    strategies = args.strategies or list(DEFAULT_STRATEGIES)
    # everything that can be checked without the models is checked before loading them (same checks as the app)
    prompt = limits.check_prompt(prompt)
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                              top_p=args.top_p, seed=limits.check_seed(args.seed))
    settings.validate()
    build_policies([s for s in strategies if s.strip() != "auto"] or ["autoregressive"])
    _check_writable(args.csv)
    _check_writable(args.tokens_csv)

    pair = _load(args)
    strategies = resolve_strategies(strategies, pair, args.models)
    final = run_all(pair, prompt, strategies, settings, chat=args.chat)
    summaries = final.summaries()
    if args.csv:
        final.export_iterations().to_csv(args.csv, index=False)
    if args.tokens_csv:
        final.export_tokens().to_csv(args.tokens_csv, index=False)
    if args.json:
        for s in summaries:
            print(json.dumps({k: _json_safe(s.get(k)) for k in JSON_FIELDS}, ensure_ascii=False))
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


# ---------------------------------------------------------------------------------------------
# profile


def add_profile(sub) -> None:
    from disco.profile import DEFAULT_PROMPTS, DEFAULT_TOKENS

    p = sub.add_parser("profile", help="measure and print this machine's cost profile and recommended lookahead")
    p.add_argument("--models", default=os.environ.get("DISCO_MODELS", "embedded"),
                   help="tiny, embedded (default), or TARGET::ASSISTANT")
    add_numerics(p)
    p.add_argument("--prompts", default=",".join(DEFAULT_PROMPTS),
                   help=f"comma-separated suite prompt ids for the acceptance replay (default {','.join(DEFAULT_PROMPTS)})")
    p.add_argument("--max-new-tokens", type=_integer, default=DEFAULT_TOKENS, help="tokens replayed per prompt")
    p.add_argument("--reps", type=_integer, default=3, help="timings per pass size (median kept)")
    p.add_argument("--refresh", action="store_true", help="measure again even if this machine's profile is cached")
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.add_argument("--csv", type=Path, help="also write the per-pass costs here (role, precision, kind, tokens, ms)")
    p.set_defaults(func=cmd_profile)


def print_profile(prof, out=None) -> None:
    from disco.calibration import flags_line

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


REF_LABEL = "threshold:0.4:20"


def cmd_profile(args) -> int:
    from disco import profile

    prompts = tuple(x.strip() for x in args.prompts.split(",") if x.strip())
    if not prompts:
        raise CliError("--prompts: give at least one suite prompt id")
    try:
        profile.suite_prompts(prompts)
    except profile.ProfileError as exc:
        raise CliError(str(exc)) from None
    if not 1 <= args.max_new_tokens <= 512:
        raise CliError(f"--max-new-tokens must be between 1 and 512, got {args.max_new_tokens}")
    if not 1 <= args.reps <= 20:
        raise CliError(f"--reps must be between 1 and 20, got {args.reps}")
    _check_writable(args.csv)
    pair = _load(args)
    prof = profile.get(pair, args.models, refresh=args.refresh, prompts=prompts, max_new_tokens=args.max_new_tokens,
                       reps=args.reps, log=_log)
    if args.csv:
        from disco import costs

        costs.write_csv(prof.cost_rows(), args.csv)
    if args.json:
        print(json.dumps(_json_safe(prof.to_dict()), ensure_ascii=False))
    else:
        print_profile(prof)
    return 0


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# models


def add_models(sub) -> None:
    p = sub.add_parser("models", help="prepare or list the model presets")
    msub = p.add_subparsers(dest="models_cmd", required=True, parser_class=Parser)
    prep = msub.add_parser("prepare", help="join, verify and convert the embedded pair into the cache (once)")
    prep.set_defaults(func=cmd_models_prepare)
    lst = msub.add_parser("list", help="show the presets and whether each is ready")
    lst.set_defaults(func=cmd_models_list)


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    return str(n)


def cmd_models_prepare(args) -> int:
    from disco import embedded

    try:
        folders = embedded.prepare(progress=True, log=_log)
    except embedded.EmbeddedError as exc:
        raise CliError(str(exc))
    total = 0
    for role, folder in folders.items():
        size = embedded.dir_size(folder)
        total += size
        print(f"{role:9s} {folder}  {_human(size)}")
    print(f"cache: {embedded.cache_dir_default()}  total {_human(total)}")
    return 0


def cmd_models_list(args) -> int:
    from disco import embedded
    from disco.models import HUB_PAIR

    print("tiny       ready      random 6-layer target + 2-layer assistant built in code (tests, quick demos)")
    state = embedded.status()
    ready = all(state[r]["ready"] for r in ("target", "assistant"))
    installed = all(state[r]["packages_installed"] for r in ("target", "assistant"))
    word = "ready" if ready else ("prepare" if installed else "missing")
    print(f"embedded   {word:9s}  Qwen2.5-Coder-1.5B-Instruct + 0.5B-Instruct from PyPI data wheels (default)")
    for role in ("target", "assistant"):
        s = state[role]
        detail = f"{s['path']} ({_human(s['size_bytes'])})" if s["ready"] else (
            "run: python -m disco models prepare" if s["packages_installed"]
            else f"missing packages: {', '.join(s['missing_packages'])}")
        print(f"  {role:9s} {detail}")
    print(f"TARGET::ASSISTANT     any two local folders or hub ids sharing a tokenizer (needs the Hub), e.g.\n"
          f"  {HUB_PAIR}")
    return 0


# ---------------------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="python -m disco", description="DISCO Lab: static vs dynamic speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_generate(sub)
    add_profile(sub)
    add_models(sub)
    from disco.train import add_train

    add_train(sub, add_numerics, _integer)
    sub.add_parser("bench", help="benchmark and sweep (python -m disco bench --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from disco import bench

        return bench.main(argv[1:])
    from disco.engine import InputError
    from disco.models import ModelLoadError
    from disco.policies import StrategyError
    from disco.profile import ProfileError

    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (CliError, InputError, StrategyError, ModelLoadError, ProfileError) as exc:
        print(f"disco: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("disco: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
