"""DISCO Lab's own suite format (``assets/suite.json``): a JSON object with a ``prompts`` list (or a bare list) of
``{"id", "kind", "chat", "prompt"}``. Strict, because we write these files: a missing id or kind, an empty prompt
or a duplicate id is an error naming the entry."""

from __future__ import annotations

import json
from pathlib import Path

from disco.errors import BenchError
from disco.suites.record import Suite, SuitePrompt

BUILTIN = Path(__file__).resolve().parents[2] / "assets" / "suite.json"
BUILTIN_KINDS = ("code", "explanation", "summarisation", "prose", "copy")  # the built-in suite's kinds, report order


def load_ours(path: Path, text: str) -> Suite:
    try:
        data = json.loads(text)
        items = data["prompts"] if isinstance(data, dict) else data
    except (ValueError, KeyError, TypeError) as exc:
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
        seen.add(pid)
        prompts.append(SuitePrompt(pid, kind, bool(item.get("chat", False)), prompt))
    if not prompts:
        raise BenchError(f"suite {path} has no prompts")
    name = path.name if path != BUILTIN else "built-in suite (assets/suite.json)"
    return Suite(name, tuple(prompts))
