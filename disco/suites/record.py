"""The one prompt record every source becomes (``SuitePrompt``), a loaded suite (``Suite``) and how a source's rows
are read (``SuiteOptions``). Nothing below the suites knows where a prompt came from: only its id, kind, chat flag,
text and, for a multi-turn chat, the user turns before it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

TURNS = ("first", "all")  # a multi-turn question: its first turn only, or every turn (each after the target's answer)


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    kind: str
    chat: bool
    prompt: str
    split: str = ""  # "train" or "test" (``disco.suites.select``): parameters are chosen on train, reported on test
    # a later turn of a multi-turn chat: the user turns before this one, oldest first; each is followed in the chat
    # by the target's own greedy answer to it (as Spec-Bench and MT-Bench run them), computed when encoded
    history: tuple[str, ...] = ()
    group: str = ""  # the question the turns belong to ("" = the prompt is its own question)

    @property
    def unit(self) -> str:
        """What samples and splits keep together: a question's turns are never split apart."""
        return self.group or self.id

    @property
    def turn(self) -> int:
        return len(self.history) + 1

    def earlier_turns(self) -> list["SuitePrompt"]:
        """The prompts of this chat's earlier turns, oldest first (their answers make this turn's history)."""
        return [SuitePrompt(turn_id(self.unit, i + 1), self.kind, self.chat, text, self.split, self.history[:i],
                            self.group) for i, text in enumerate(self.history)]

    @property
    def fingerprint(self) -> str:
        """A short hash of what the prompt asks (text, chat flag, earlier turns): two suites that reuse an id for
        different prompts never share a cached table (``disco.bench`` checks it)."""
        blob = json.dumps([self.prompt, self.chat, list(self.history)], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


def turn_id(question: str, turn: int) -> str:
    return f"{question}-t{turn}"


@dataclass(frozen=True)
class Suite:
    """The prompts of one source, in the source's order, and the rows the source held that could not be used."""

    name: str                                   # how reports name the source (file, dataset, wheel and version)
    prompts: tuple[SuitePrompt, ...]
    dropped: tuple[tuple[str, str], ...] = ()   # (row id, why): empty prompts, unreadable rows (counted in reports)
    notes: tuple[str, ...] = field(default=())  # how the rows were mapped (field, template, turns), for reports

    @property
    def kinds(self) -> list[str]:
        return list(dict.fromkeys(p.kind for p in self.prompts))


@dataclass(frozen=True)
class SuiteOptions:
    """How rows become prompts. ``None`` means the source's own default (see each source)."""

    prompt_field: str | None = None   # the column holding the prompt
    template: str | None = None       # or a template over columns, e.g. "Summarize:\\n{article}"
    id_field: str | None = None
    kind_field: str | None = None
    chat: bool | None = None          # wrap in the target's chat template (None: the row's `chat` or the default)
    turns: str = "first"              # multi-turn questions: "first" or "all"
    max_prompts: int | None = None    # refuse a source with more usable rows than this (an upload on a hosted app)
    max_bytes: int | None = None      # refuse a file whose text (after gunzip) is longer than this
