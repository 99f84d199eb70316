"""Command line: ``python -m disco {generate,models,bench}``.

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
    from disco.policies import DEFAULT_STRATEGIES

    p = sub.add_parser("generate", help="run strategies side by side on one prompt and print their summaries")
    p.add_argument("--models", default=os.environ.get("DISCO_MODELS", "embedded"),
                   help="tiny, embedded (default), or TARGET::ASSISTANT (local folders or hub ids)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    p.add_argument("--strategy", action="append", dest="strategies", metavar="SPEC",
                   help="repeatable: autoregressive, static:K, heuristic:K, threshold:TAU[:KMAX], oracle[:KMAX] "
                        f"(default: {' '.join(DEFAULT_STRATEGIES)})")
    p.add_argument("--max-new-tokens", type=_integer, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=_float, default=1.0)
    p.add_argument("--top-p", type=_float, default=1.0)
    p.add_argument("--seed", type=_integer, default=0)
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--csv", type=Path, help="write the per-iteration trace of all strategies here")
    p.add_argument("--tokens-csv", type=Path, help="write the per-token trace of all strategies here")
    p.add_argument("--json", action="store_true", help="print one JSON object per strategy instead of a table")
    p.set_defaults(func=cmd_generate)


def _check_writable(path: Path | None) -> None:
    if path is not None and not path.expanduser().resolve().parent.is_dir():
        raise CliError(f"cannot write {path}: folder {path.expanduser().resolve().parent} does not exist")


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


JSON_FIELDS = ["strategy", "text", "new_tokens", "seconds", "tokens_per_s", "speedup", "target_calls", "draft_calls",
               "acceptance_rate", "mean_lookahead", "ttft_ms", "decode_tokens_per_s", "iterations", "drafted", "accepted",
               "overhead_pct", "identical_to_autoregressive", "finish_reason", "models", "target", "assistant",
               "dtype", "device", "prompt_tokens", "chat", "max_new_tokens", "sample", "temperature", "top_p", "seed"]


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def print_table(summaries: list[dict], out=None) -> None:
    out = out or sys.stdout
    head = ["strategy", "tokens", "seconds", "tok/s", "speed-up", "target", "draft", "accept", "mean K", "TTFT ms", "identical"]
    rows = []
    for s in summaries:
        ident = s["identical_to_autoregressive"]
        rows.append([s["strategy"], str(s["new_tokens"]), _fmt(s["seconds"], ".2f"), _fmt(s["tokens_per_s"], ".2f"),
                     _fmt(s["speedup"], ".2f") + ("x" if not math.isnan(s["speedup"]) else ""),
                     str(s["target_calls"]), str(s["draft_calls"]), _fmt(s["acceptance_rate"], ".2f"),
                     _fmt(s["mean_lookahead"], ".2f"), _fmt(s["ttft_ms"], ".0f"),
                     "-" if ident is None else ("yes" if ident else "NO")])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(head), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print(line(r), file=out)


def cmd_generate(args) -> int:
    from disco.engine import DecodeSettings
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
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed)
    # everything that can be checked without the models is checked before loading them
    settings.validate()
    build_policies(strategies)
    if not prompt.strip():
        raise CliError("the prompt is empty")
    _check_writable(args.csv)
    _check_writable(args.tokens_csv)

    pair = load_pair(args.models, dtype=args.dtype, device=args.device, log=_log)
    final = run_all(pair, prompt, strategies, settings, chat=args.chat)
    summaries = final.summaries()
    if args.csv:
        final.export_iterations().to_csv(args.csv, index=False)
    if args.tokens_csv:
        final.export_tokens().to_csv(args.tokens_csv, index=False)
    if args.json:
        for s in summaries:
            print(json.dumps({k: _clean(s.get(k)) for k in JSON_FIELDS}, ensure_ascii=False))
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
    add_models(sub)
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

    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (CliError, InputError, StrategyError, ModelLoadError) as exc:
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
