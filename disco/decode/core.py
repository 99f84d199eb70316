"""The iteration core: the model-free part of one draft -> verify -> accept iteration, written once.

Live decoding (``disco.decode.live.Decoder``) and exact greedy replay (``disco.replay.run.ReplayRun``) are two
backends behind it; the core owns everything else:

  1. budget: ``policy.budget()``, capped at ``max_new_tokens - len(output) - 1`` so the target's own
     token always fits (transformers caps it the same way, which keeps pass counts comparable);
  2. the draft-stop loop: one assistant pass per drafted token, stopping at the budget, at EOS, when
     ``policy.drop(DraftStep)`` drops the token just drafted (the oracle; AdaEDL judges a distribution
     before using its token; llama.cpp's p-min), or when ``policy.stop_after(DraftStep)`` says so (that token
     is verified); then ``policy.keep(steps)`` may send fewer (llama.cpp discards drafts shorter than n-min);
     a policy that ``proposes`` (prompt lookup) drafts instead from the context with no model pass, and a policy that
     does both (``hybrid``) drafts from the context when that gives a draft, else with the assistant;
  3. verification by the backend (one target pass over what the target has not seen plus the drafts);
  4. accept and cut: accepted drafts + the target's token, cut at EOS and at ``max_new_tokens``;
  5. cache bookkeeping as lengths: the target cache holds ``ids[:-1]`` after every iteration; the
     assistant cache holds at most ``ids[:-2]`` (as transformers' assisted generation does) and never a
     token that was not accepted; the backend crops its caches to those lengths (``rollback``);
  6. ``policy.update`` and the ``IterationRecord``, timed by the backend's clock (wall time live, modelled
     time in replay), so the same record fields mean the same thing in both.

A backend implements ``clock``, ``draft``, ``verify``, ``rollback`` and, optionally, ``probe`` (the oracle's
untimed look at the verification, live only), ``commit`` (per-token records) and ``settle`` (untimed work
after an iteration). The test ``tests/unit/test_core.py`` checks the two give identical records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from disco.policies import DraftStep, Policy
from disco.decode.trace import (
    STOP_CONFIDENCE, STOP_EOS, STOP_LENGTH, STOP_MAX_LOOKAHEAD, STOP_NONE, STOP_ORACLE, STOP_SHORT, STOP_SOURCE,
    IterationRecord,
)


@dataclass(frozen=True)
class Drafted:
    """One assistant pass: the token it drafted and the draft distribution's features."""

    token: int
    prob: float
    entropy: float
    margin: float
    ms: float  # the pass's cost (measured live, modelled in replay)
    top10: float = math.nan  # mass of the draft distribution's 10 likeliest tokens


@dataclass
class _Draft:
    """One iteration's draft: who made it, its steps, why it stopped, the policy's budget for it, and its passes."""

    drafter: str                 # "lookup" (the context) or "assistant"
    steps: list[DraftStep]
    stop: str
    k_policy: int
    forward_ms: float = 0.0
    draft_calls: int = 0
    assistant_fed: int = 0


@dataclass(frozen=True)
class Verdict:
    """One target pass: how many drafts it accepted and its own next token."""

    accepted: int
    token: int
    ms: float


class Backend(Protocol):
    assistant_precision: str

    def clock(self) -> float: ...                                        # ms; untimed work excluded
    def draft(self, core: "IterationCore", index: int, fed: int) -> Drafted: ...
    def verify(self, core: "IterationCore", fed: int, steps: list[DraftStep]) -> Verdict: ...
    def rollback(self, t_len: int, a_len: int) -> None: ...


class CoreView:
    """What a backend that owns an ``IterationCore`` (``self.core``) shows of it: the run's state, read-only."""

    core: "IterationCore"

    @property
    def ids(self) -> list[int]:
        return self.core.ids

    @property
    def output_ids(self) -> list[int]:
        return self.core.output_ids

    @property
    def records(self) -> list[IterationRecord]:
        return self.core.records

    @property
    def done(self) -> bool:
        return self.core.done

    @property
    def finish_reason(self) -> str | None:
        return self.core.finish_reason

    @property
    def elapsed_ms(self) -> float:
        return self.core.elapsed_ms

    @property
    def position(self) -> int:
        return self.core.out_len

    @property
    def assistant_tokens(self) -> int:
        return self.core.assistant_tokens


class IterationCore:
    """The state of one policy decoding one prompt (lengths and token ids) and its ``step``."""

    def __init__(self, policy: Policy, prompt_ids: list[int], max_new_tokens: int, eos, backend: Backend):
        self.policy = policy
        self.backend = backend
        self.prompt_len = len(prompt_ids)
        self.ids = list(prompt_ids)       # prompt + output so far
        self.max_new_tokens = int(max_new_tokens)
        self.eos = set(eos)
        self.t_len = 0                    # tokens in the target's cache
        self.a_len = 0                    # tokens in the assistant's cache
        self.assistant_tokens = 0         # tokens fed to the assistant so far (prefill included)
        self.elapsed_ms = 0.0
        self.records: list[IterationRecord] = []
        self.done = False
        self.finish_reason: str | None = None
        self.drafter = "none"              # who drafted this iteration: "assistant", "lookup" (the context) or "none"

    @property
    def out_len(self) -> int:
        return len(self.ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self.prompt_len:]

    def budgets(self) -> tuple[int, int]:
        """(the policy's budget, the tokens it may draft this iteration: that budget within the room left, less the
        target's own token)."""
        k_policy = self.policy.budget()
        room = self.max_new_tokens - self.out_len - 1
        return k_policy, (max(0, min(k_policy, room)) if self.policy.drafts else 0)

    def step(self) -> IterationRecord:
        # One function on purpose (~90 lines, the two ways of drafting in helpers below): the six phases share the
        # iteration's state, and reading them in order, in one place, is how the invariants are checked.
        policy, backend = self.policy, self.backend
        clock = backend.clock
        t0 = clock()
        out_len = self.out_len
        remaining = self.max_new_tokens - out_len
        k_policy, budget = self.budgets()
        threshold = policy.threshold
        forward_ms = 0.0
        draft_calls = 0
        assistant_fed = 0  # tokens fed to the assistant this iteration (its first pass catches up, then one each)
        stop = STOP_NONE

        # 1-2. a model-free draft from the context first (prompt lookup); then, when the policy drafts with the
        # assistant and the context gave nothing, the assistant's draft-stop loop (a hybrid policy does both)
        draft = self._draft_from_context(remaining, out_len) if policy.proposes else None
        if draft is None and policy.uses_assistant:
            draft = self._draft_with_assistant(budget, k_policy, out_len)
        drafter, steps = (draft.drafter, draft.steps) if draft is not None else ("none", [])
        if draft is not None:
            stop, k_policy, forward_ms = draft.stop, draft.k_policy, draft.forward_ms
            draft_calls, assistant_fed = draft.draft_calls, draft.assistant_fed
        if drafter == "lookup" and policy.uses_assistant:
            threshold = None  # a hybrid's copied draft: its assistant rule's threshold played no part
        self.drafter = drafter
        kept = policy.keep(steps) if steps else 0
        if kept < len(steps):  # e.g. llama.cpp's n-min: a draft too short to be worth sending is not sent
            steps, stop = steps[:kept], STOP_SHORT
        t1 = clock()
        if policy.probes_verification and steps:
            keep = backend.probe(self, [s.token for s in steps])  # untimed: the oracle knows what will be accepted
            if keep < len(steps):
                steps, stop = steps[:keep], STOP_ORACLE
            t1 = clock()

        # 3. verify: one target pass over [everything the target has not seen] + drafts
        drafts = [s.token for s in steps]
        target_fed = len(self.ids) - self.t_len + len(drafts)
        verdict = backend.verify(self, target_fed, steps)
        self.t_len += target_fed
        forward_ms += verdict.ms
        accepted = verdict.accepted

        # 4. accept, then cut at EOS and at max_new_tokens (never emit past either)
        new = drafts[:accepted] + [verdict.token]
        for i, token in enumerate(new):
            if token in self.eos:
                new = new[: i + 1]
                self.done, self.finish_reason = True, "eos"
                break
        if len(new) >= remaining:
            new = new[:remaining]
            if not self.done:
                self.done, self.finish_reason = True, "length"
        old_len = len(self.ids)
        self.ids.extend(new)

        # 5. roll both caches back to what was accepted
        self.t_len = min(self.t_len, len(self.ids) - 1)
        if policy.uses_assistant:
            self.a_len = min(self.a_len, old_len + accepted, len(self.ids) - 2)
        backend.rollback(self.t_len, self.a_len)
        t2 = clock()

        # 6. record
        iteration = len(self.records) + 1
        rejected = accepted < len(drafts) or stop == STOP_ORACLE
        commit = getattr(backend, "commit", None)
        if commit is not None:
            commit(self, new, steps, accepted, rejected, iteration)
        policy.update(steps, accepted)
        settle = getattr(backend, "settle", None)
        if settle is not None:
            settle(self)
        t3 = clock()
        iteration_ms = t3 - t0
        self.elapsed_ms += iteration_ms
        confidences = [s.prob for s in steps]
        record = IterationRecord(
            strategy=policy.spec, iteration=iteration, lookahead=len(drafts), accepted=accepted, emitted=len(new),
            stop_reason=stop, min_confidence=min(confidences) if confidences else math.nan,
            threshold=threshold if threshold is not None else math.nan,
            max_lookahead=k_policy if policy.drafts else 0,
            draft_ms=t1 - t0, verify_ms=t2 - t1, iteration_ms=iteration_ms, elapsed_ms=self.elapsed_ms,
            new_tokens=self.out_len, target_tokens=target_fed, draft_calls=draft_calls, assistant_tokens=assistant_fed,
            forward_ms=forward_ms,
            confidences=confidences,
            assistant_precision=backend.assistant_precision if drafter == "assistant" else "none",
            drafter=drafter,
        )
        self.records.append(record)
        return record

    def _draft_from_context(self, remaining: int, out_len: int) -> "_Draft | None":
        """A model-free draft (prompt lookup and its kin): point masses, confidence 1, no model pass. None when the
        context has nothing and the policy can draft with the assistant instead (a hybrid)."""
        policy = self.policy
        k_context = policy.propose_budget()
        room = max(0, min(k_context, remaining - 1))
        tokens = policy.propose(self.ids, room, self.eos)[:room]
        if not tokens and policy.uses_assistant:
            return None
        steps: list[DraftStep] = []
        for token in tokens:
            steps.append(DraftStep.first(out_len, token, 1.0, 0.0, 1.0, 1.0) if not steps
                         else steps[-1].then(token, 1.0, 0.0, 1.0, 1.0))
        stop = (STOP_LENGTH if room < k_context else STOP_MAX_LOOKAHEAD) if len(tokens) == room else STOP_SOURCE
        return _Draft("lookup", steps, stop, k_context)

    def _draft_with_assistant(self, budget: int, k_policy: int, out_len: int) -> "_Draft":
        """The assistant's draft-stop loop: one pass per token until the budget, EOS, or the policy stops it."""
        policy, backend = self.policy, self.backend
        draft = _Draft("assistant", [], STOP_LENGTH if budget < k_policy else STOP_MAX_LOOKAHEAD, k_policy)
        steps = draft.steps
        for j in range(budget):
            fed = len(self.ids) - self.a_len if j == 0 else 1  # catch up on committed tokens, then one draft
            d = backend.draft(self, j, fed)
            self.a_len += fed
            self.assistant_tokens += fed
            draft.assistant_fed += fed
            draft.forward_ms += d.ms
            draft.draft_calls += 1
            step = (DraftStep.first(out_len, d.token, d.prob, d.entropy, d.margin, d.top10) if not steps
                    else steps[-1].then(d.token, d.prob, d.entropy, d.margin, d.top10))
            if policy.drop(step):  # not verified: the oracle's knowledge, or a rule that judges a token first
                draft.stop = STOP_ORACLE if policy.probes_verification else STOP_CONFIDENCE
                break
            steps.append(step)
            if d.token in self.eos:
                draft.stop = STOP_EOS
                break
            if policy.stop_after(step):
                draft.stop = STOP_CONFIDENCE
                break
        return draft
