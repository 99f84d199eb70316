"""DISCO Lab's own suite format (``assets/suite.json``): a JSON object with a ``prompts`` list (or a bare list) of
``{"id", "kind", "chat", "prompt"}``. Strict, because we write these files: a missing id or kind, an empty prompt
or a duplicate id is an error naming the entry."""

from __future__ import annotations

from pathlib import Path

from disco.errors import BenchError
from disco.suites.files import parse_json
from disco.suites.record import Suite, SuitePrompt
from disco.suites.rows import why_unusable

BUILTIN = Path(__file__).resolve().parents[2] / "assets" / "suite.json"
BUILTIN_KINDS = ("code", "explanation", "summarisation", "prose", "copy")  # the built-in suite's kinds, report order


def load_ours(path: Path, text: str, max_prompts: int | None = None) -> Suite:
    data = parse_json(path, text)
    try:
        items = data["prompts"] if isinstance(data, dict) else data
    except (KeyError, TypeError) as exc:
        raise BenchError(f"suite {path} is not valid JSON of prompts: {exc}") from None
    if not isinstance(items, list):
        raise BenchError(f"suite {path}: its prompts are not a list")
    prompts, seen = [], set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BenchError(f"suite {path}: entry {i} is not an object")
        pid, kind, prompt = item.get("id"), item.get("kind"), item.get("prompt")
        if not isinstance(pid, str) or not pid.strip():
            raise BenchError(f"suite {path}: entry {i} has no id")
        if pid in seen:
            raise BenchError(f"suite {path}: duplicate id {pid!r}")
        if not isinstance(kind, str) or not kind.strip():
            raise BenchError(f"suite {path}: prompt {pid!r} has no kind")
        if not isinstance(prompt, str) or not prompt.strip():
            raise BenchError(f"suite {path}: prompt {pid!r} is empty")
        why = why_unusable(prompt)
        if why:
            raise BenchError(f"suite {path}: prompt {pid[:80]!r} is {why}")
        seen.add(pid)
        prompts.append(SuitePrompt(pid[:200], kind[:80], bool(item.get("chat", False)), prompt))
        if max_prompts is not None and len(prompts) > max_prompts:
            raise BenchError(f"suite {path.name} has more than {max_prompts:,} prompts, this app's limit per suite")
    if not prompts:
        raise BenchError(f"suite {path} has no prompts")
    name = path.name if path != BUILTIN else "built-in suite (assets/suite.json)"
    return Suite(name, tuple(prompts))
