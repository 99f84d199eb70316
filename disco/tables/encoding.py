"""A suite prompt's token ids for one pair and run length: the chat template, a multi-turn chat's earlier answers,
and the length rule (``disco.tables.fitting``).

A later turn of a multi-turn chat (``SuitePrompt.history``) is encoded as the whole chat so far: each earlier user
turn followed by the target's own greedy answer to it, cut at ``max_new_tokens`` as that turn's table holds it. The
encoder never builds a table: whoever encodes a later turn gives it the earlier turns' tables first (``answer``;
``disco.tables.phase.TablePhase`` builds them in order), and asking for a later turn whose earlier answers it has not
been given is an error (``TurnUnanswered``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from disco.errors import BenchError
from disco.suites import SuitePrompt
from disco.tables.fitting import MIN_KEPT, Fitting, PromptSkipped
from disco.tables.identity import history_sha, prompt_about


class TurnUnanswered(BenchError):
    """A later turn was asked for before its earlier turns' tables were given (``PromptEncoder.answer``)."""


@dataclass
class Encoded:
    ids: list[int]
    text: str        # the user's text as encoded (cut, where the rule cut it)
    cut: int = 0     # tokens taken out of the user's text
    history: list[dict] = field(default_factory=list)  # the chat before it: earlier turns and the target's answers


class PromptEncoder:
    """Token ids of suite prompts for one pair and run length, with the length rule applied; remembers what it cut
    and skipped (``cut``, ``skipped``) for the report, and each earlier turn's answer it was given."""

    def __init__(self, pair, max_new_tokens: int, fitting: Fitting | None = None):
        self.pair, self.max_new_tokens = pair, max_new_tokens
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

    def answered(self, prompt: SuitePrompt) -> bool:
        return prompt.id in self.answers

    def answer(self, prompt: SuitePrompt, table) -> None:
        """Take an earlier turn's table (built from ``ids(prompt)``): the target's answer to it, which later turns
        follow."""
        answer = table.reference_for(self.max_new_tokens)
        self.answers[prompt.id] = self.pair.decode(answer)
        self.turn_tables[prompt.id] = (list(table.prompt_ids), list(answer))

    def ids_for(self, other, prompt: SuitePrompt) -> list[int]:
        """The same prompt (its cut text, the same earlier answers) encoded for another pair (``--other-engine``)."""
        self.ids(prompt)
        e = self.encoded[prompt.id]
        if prompt.chat:
            return other.encode_chat(e.history + [{"role": "user", "content": e.text}])
        return other.encode(e.text, False)

    def about(self, prompt: SuitePrompt) -> dict:
        """What a table of this prompt records about it (``disco.tables.identity.prompt_about``)."""
        e = self.encoded[prompt.id]
        return prompt_about(prompt, e.cut, self.pair.context_length, self.fitting, self.limit, self.max_new_tokens,
                            self.history_sha.get(prompt.id))

    def _history(self, prompt: SuitePrompt) -> list[dict]:
        messages = []
        for earlier in prompt.earlier_turns():
            try:
                self.ids(earlier)
            except PromptSkipped:
                raise PromptSkipped(f"{prompt.id}: its earlier turn {earlier.id} does not fit") from None
            if earlier.id not in self.answers:
                raise TurnUnanswered(f"{prompt.id}: its earlier turn {earlier.id} has no table yet (build it first)")
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
