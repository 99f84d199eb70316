"""A suite prompt's token ids: the chat template, a multi-turn chat's earlier answers, and the length rule.

* A later turn of a multi-turn chat (``SuitePrompt.history``) is encoded as the whole chat so far: each earlier user
  turn followed by the target's own greedy answer to it, cut at ``max_new_tokens`` as that turn's table holds it
  (``build_table`` of the earlier turn: computed once, cached, and the same table the earlier turn is replayed on).
* **The length rule.** A prompt fits when its tokens plus ``max_new_tokens`` are within the models' context and its
  tokens within ``max_prompt_tokens`` (the operator's or the user's budget, if any). One that does not is
  ``skip``-ped (the default: counted and named in the report, never replayed), or cut in the ``middle``: the user's
  text loses tokens from its middle until it fits, keeping its beginning and its end, where instructions sit (the
  rule LongBench uses, Bai et al. 2023), its earlier turns and the template untouched; a prompt whose template and
  earlier turns alone leave fewer than ``MIN_KEPT`` tokens is skipped. Either way the report counts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from disco.errors import BenchError
from disco.replay.tables import build_table
from disco.suites import SuitePrompt

LONG_RULES = ("skip", "middle")
MIN_KEPT = 16  # tokens of the user's text a cut prompt keeps at least


class PromptSkipped(BenchError):
    """The prompt does not fit the context or the prompt budget and the rule is to skip it."""


@dataclass(frozen=True)
class Fitting:
    """How prompts are fitted to the context: the budget (None: the context alone) and the rule for the rest."""

    max_prompt_tokens: int | None = None
    rule: str = "skip"

    def __post_init__(self):
        if self.rule not in LONG_RULES:
            raise BenchError(f"--long-prompts must be one of {', '.join(LONG_RULES)}, got {self.rule!r}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < MIN_KEPT:
            raise BenchError(f"--max-prompt-tokens must be at least {MIN_KEPT}, got {self.max_prompt_tokens}")

    def words(self) -> str:
        budget = f"at most {self.max_prompt_tokens} prompt tokens and " if self.max_prompt_tokens else ""
        how = "skipped" if self.rule == "skip" else "cut in the middle (beginning and end kept)"
        return f"a prompt must fit {budget}the context with the new tokens; longer ones are {how}"


@dataclass
class Encoded:
    ids: list[int]
    text: str        # the user's text as encoded (cut, where the rule cut it)
    cut: int = 0     # tokens taken out of the user's text
    history: list[dict] = field(default_factory=list)  # the chat before it: earlier turns and the target's answers


class PromptEncoder:
    """Token ids of suite prompts for one pair and run length, with the length rule applied; remembers what it cut
    and skipped (``cut``, ``skipped``) for the report, and each earlier turn's answer."""

    def __init__(self, pair, max_new_tokens: int, cache_dir: Path | None, fitting: Fitting | None = None):
        self.pair, self.max_new_tokens, self.cache_dir = pair, max_new_tokens, cache_dir
        self.fitting = fitting or Fitting()
        room = pair.context_length - max_new_tokens
        self.limit = min(room, self.fitting.max_prompt_tokens or math.inf)
        self.encoded: dict[str, Encoded] = {}
        self.skipped: dict[str, str] = {}
        self.answers: dict[str, str] = {}
        self.turn_tables: dict[str, tuple[list[int], list[int]]] = {}  # earlier turn -> (its ids, its answer's ids)
        self.history_sha: dict[str, str] = {}

    @property
    def cut(self) -> dict[str, int]:
        """Tokens taken out of each prompt the rule cut."""
        return {pid: e.cut for pid, e in self.encoded.items() if e.cut}

    def ids(self, prompt: SuitePrompt) -> list[int]:
        """The prompt's token ids; PromptSkipped (counted in ``skipped``) where the rule drops it."""
        if prompt.id in self.skipped:
            raise PromptSkipped(f"{prompt.id}: {self.skipped[prompt.id]}")
        if prompt.id not in self.encoded:
            try:
                self.encoded[prompt.id] = self._fit(prompt, self._history(prompt))
            except PromptSkipped as exc:
                self.skipped[prompt.id] = str(exc).split(": ", 1)[-1]
                raise
        return self.encoded[prompt.id].ids

    def ids_for(self, other, prompt: SuitePrompt) -> list[int]:
        """The same prompt (its cut text, the same earlier answers) encoded for another pair (``--other-engine``)."""
        self.ids(prompt)
        e = self.encoded[prompt.id]
        if prompt.chat:
            return other.encode_chat(e.history + [{"role": "user", "content": e.text}])
        return other.encode(e.text, False)

    def about(self, prompt: SuitePrompt) -> dict:
        """What a table of this prompt records about it (``disco.replay.tables.build_table``'s ``about``)."""
        e = self.encoded[prompt.id]
        info = {"sha": prompt.fingerprint, "cut": e.cut, "context": self.pair.context_length}
        if e.cut:
            info.update(rule=self.fitting.rule, limit=int(self.limit))
        if prompt.history:
            info["answers"] = self.max_new_tokens  # the earlier turns' answers are this long at most
            info["history"] = self.history_sha[prompt.id]  # exactly which earlier turns and answers it follows
        return info

    def _history(self, prompt: SuitePrompt) -> list[dict]:
        messages = []
        for earlier in prompt.earlier_turns():
            try:
                ids = self.ids(earlier)
            except PromptSkipped:
                raise PromptSkipped(f"{prompt.id}: its earlier turn {earlier.id} does not fit") from None
            if earlier.id not in self.answers:
                table = build_table(self.pair, ids, self.max_new_tokens, self.cache_dir, name=earlier.id,
                                    about=self.about(earlier))
                if table.dirty:
                    table.save()
                answer = table.reference_for(self.max_new_tokens)
                self.answers[earlier.id] = self.pair.decode(answer)
                self.turn_tables[earlier.id] = (list(table.prompt_ids), list(answer))
                table.release()
            messages += [{"role": "user", "content": self.encoded[earlier.id].text},
                         {"role": "assistant", "content": self.answers[earlier.id]}]
        if prompt.history:
            self.history_sha[prompt.id] = history_sha([self.turn_tables[e.id] for e in prompt.earlier_turns()])
        return messages

    def _encode(self, prompt: SuitePrompt, messages: list[dict], text: str) -> list[int]:
        if prompt.chat:
            return self.pair.encode_chat(messages + [{"role": "user", "content": text}])
        return self.pair.encode(text, False)

    def _fit(self, prompt: SuitePrompt, messages: list[dict]) -> Encoded:
        ids = self._encode(prompt, messages, prompt.prompt)
        if len(ids) <= self.limit:
            return Encoded(ids, prompt.prompt, 0, messages)
        why = self._too_long(len(ids))
        if self.fitting.rule == "skip":
            raise PromptSkipped(f"{prompt.id}: {why}")
        tokens = self.pair.text_tokens(prompt.prompt)
        keep = len(tokens) - (len(ids) - int(self.limit))
        for _ in range(4):  # a cut can re-tokenize a little longer at the seam: take a few more and retry
            if keep < MIN_KEPT:
                raise PromptSkipped(f"{prompt.id}: {why}, and cutting its text leaves fewer than {MIN_KEPT} tokens")
            head = keep // 2
            text = self.pair.tokenizer.decode(tokens[:head]) + self.pair.tokenizer.decode(tokens[len(tokens) - (keep - head):])
            ids = self._encode(prompt, messages, text)
            if len(ids) <= self.limit:
                return Encoded(ids, text, len(tokens) - keep, messages)
            keep -= len(ids) - int(self.limit)
        raise PromptSkipped(f"{prompt.id}: {why}, and cutting it in the middle did not make it fit")

    def _too_long(self, n: int) -> str:
        context = self.pair.context_length
        if n + self.max_new_tokens > context:
            return f"{n} prompt tokens + {self.max_new_tokens} new tokens exceed the models' context of {context}"
        return f"{n} prompt tokens exceed the budget of {self.fitting.max_prompt_tokens} (--max-prompt-tokens)"


def history_sha(turns: list[tuple[list[int], list[int]]]) -> str:
    """A short hash of the earlier turns a later turn follows: each one's token ids and the target's answer to it."""
    import hashlib
    import json

    return hashlib.sha1(json.dumps(turns, separators=(",", ":")).encode()).hexdigest()[:16]


def table_matches(meta: dict, prompt: SuitePrompt, fitting: Fitting, max_new_tokens: int,
                  history: str | None = None) -> bool:
    """Whether a cached table (found by the prompt's id, without the models) was built from this prompt as this run
    would encode it: the same text (fingerprint), cut only if this run cuts it and to the same length, and for a later
    turn the same earlier turns and answers (``history``: ``history_sha`` of the earlier turns' cached tables, which
    must match this run too). A table from before suites described their prompts matches by id alone."""
    about = meta.get("prompt")
    if not about:
        return not prompt.history
    if about.get("sha") != prompt.fingerprint or (prompt.history and about.get("answers") != max_new_tokens):
        return False
    if prompt.history and about.get("history") != history:  # the earlier turns as cached now (their cut, answers)
        return False
    limit = min(int(about.get("context", 0)) - max_new_tokens, fitting.max_prompt_tokens or math.inf)
    if about.get("cut"):
        return fitting.rule == about.get("rule") and about.get("limit") == limit
    return int(meta.get("prompt_tokens") or 0) <= limit


def add_arguments(p) -> None:
    g = p.add_argument_group("long prompts")
    g.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                   help="a prompt budget in tokens (default: the models' context less the new tokens)")
    g.add_argument("--long-prompts", choices=LONG_RULES, default="skip",
                   help="a prompt over the context or the budget: skip it (default) or cut its text in the middle "
                        "(beginning and end kept); either way the report counts it")


def fitting_from_args(args) -> Fitting:
    return Fitting(args.max_prompt_tokens, args.long_prompts)
