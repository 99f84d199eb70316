"""The benchmark's prompt suite (assets/suite.json): loading, checking and picking prompts."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from disco.errors import UserError

DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "assets" / "suite.json"
KINDS = ("code", "explanation", "summarisation", "prose", "copy")


class BenchError(UserError, ValueError):
    """A user-facing benchmark error (one line on stderr, exit 2)."""


# ---------------------------------------------------------------------------------------------
# the prompt suite


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    kind: str
    chat: bool
    prompt: str
    split: str = ""  # "train" or "test" (``split_of``): parameters are chosen on train, reported on test


def load_suite(path: str | os.PathLike | None = None) -> list[SuitePrompt]:
    """Read a suite (.json with a "prompts" list, a bare list, or .jsonl). Checks ids, kinds and texts."""
    path = Path(path) if path else DEFAULT_SUITE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"cannot read suite {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".jsonl":
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            items = data["prompts"] if isinstance(data, dict) else data
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"suite {path} is not valid JSON of prompts: {exc}") from None
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
    which = split_of(prompts)
    return [dataclasses.replace(p, split=which[p.id]) for p in prompts]


def pick_prompts(prompts: list[SuitePrompt], count: int | None) -> list[SuitePrompt]:
    """``count`` prompts spread over the kinds (round-robin in suite order); all when count is None."""
    if count is None or count >= len(prompts):
        return list(prompts)
    by_kind: dict[str, list[SuitePrompt]] = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    chosen: list[SuitePrompt] = []
    while len(chosen) < count:
        for kind in list(by_kind):
            if by_kind[kind] and len(chosen) < count:
                chosen.append(by_kind[kind].pop(0))
    order = {p.id: i for i, p in enumerate(prompts)}
    return sorted(chosen, key=lambda p: order[p.id])


def filter_prompts(prompts: list[SuitePrompt], selection: str | None) -> list[SuitePrompt]:
    """Keep prompts whose id or kind is in a comma-separated selection."""
    if not selection:
        return prompts
    wanted = {s.strip() for s in selection.split(",") if s.strip()}
    kept = [p for p in prompts if p.id in wanted or p.kind in wanted]
    unknown = wanted - {p.id for p in prompts} - {p.kind for p in prompts}
    if unknown:
        raise BenchError(f"unknown prompt id or kind: {sorted(unknown)[0]}")
    return kept


# ---------------------------------------------------------------------------------------------


SPLITS = ("all", "train", "test")


def split_of(prompts: list[SuitePrompt]) -> dict[str, str]:
    """Each prompt's split, by prompt: within each kind, in suite order, alternately train and test. Parameters
    (the classifier's weights, the best setting of each policy) are chosen on train and reported on test."""
    seen: dict[str, int] = {}
    out = {}
    for p in prompts:
        i = seen.get(p.kind, 0)
        seen[p.kind] = i + 1
        out[p.id] = "train" if i % 2 == 0 else "test"
    return out


def split_prompts(prompts: list[SuitePrompt], split: str | None) -> list[SuitePrompt]:
    """The prompts of one split (``all`` or None: every prompt)."""
    if not split or split == "all":
        return list(prompts)
    if split not in SPLITS:
        raise BenchError(f"unknown split {split!r}: use {', '.join(SPLITS)}")
    which = {p.id: p.split for p in prompts} if all(p.split for p in prompts) else split_of(prompts)
    return [p for p in prompts if which[p.id] == split]

