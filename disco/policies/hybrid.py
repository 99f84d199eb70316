"""Hybrid drafting: a model-free draft from the context when there is one, else the assistant's draft.

``hybrid:CONTEXT+ASSISTANT`` joins two specs of other kinds: CONTEXT a drafter without a model (``lookup``, ``copy``,
``suffix``, ``ngram``) and ASSISTANT any rule that drafts with the assistant (``threshold:0.4:20``, ``static:2``,
``pmin:0.4:3``, ``sglang``, ``bandit:20``, ...); an ``@int8`` / ``@q4_0`` suffix at the end is the assistant's.
Each iteration the context drafter is asked first; if it proposes tokens they are the draft (no assistant pass, a
point mass as for prompt lookup, so sampling stays exact); otherwise the assistant drafts under its own rule. Each
part keeps its own state and hears only about the drafts it made (``update``). The trace's ``drafter`` column says
per iteration which part drafted.

This is what llama.cpp does with a comma-separated ``--spec-type`` (vendored llama.cpp in llama-cpp-python 0.3.36,
``common/speculative.cpp``: ``common_speculative_init`` orders the implementations by a fixed priority, the n-gram
drafters before the draft model whatever order the list was written in; ``common_speculative_draft`` asks them in
that order and the first non-empty draft wins, cut to the room left; ``common_speculative_accept`` credits the one
used). So ``hybrid:ngram:N:M+pmin:P:NMAX:NMIN`` is llama.cpp's ``--spec-type ngram-simple,draft-simple`` with the
same sizes (``disco.policies.export`` gives the flags).
"""

from __future__ import annotations

from typing import Callable

from disco.policies.base import (
    DraftStep, Policy, RunContext, StrategyError, canonical_spec, parse_strategy, policy_kinds,
)

DEFAULT_CONTEXT = "copy:16:3"
DEFAULT_ASSISTANT = "threshold:0.4:20"
# the default grid: context drafters from eager to strict, times assistant rules from eager to the cost-aware one
# (which drafts nothing where no draft pays: then the hybrid is its context drafter alone, a plain step on a miss)
CONTEXTS = ("copy:16:2", "copy:16:3", "copy:16:5", "lookup:10", "ngram:3:16", "ngram:12:48")
ASSISTANTS = ("threshold:0.2:10", "threshold:0.4:10", "threshold:0.6:10", "threshold:0.8:10", "threshold:0.2:20",
              "threshold:0.4:20", "threshold:0.6:20", "threshold:0.8:20", "static:1", "static:2", "static:4",
              "pmin:0.4:3", "costaware:10", "costaware:20")


def join_llama_flags(context: list[str], assistant: list[str]) -> list[str]:
    """Two llama.cpp flag lists that each start with ``--spec-type T`` as one: ``--spec-type C,A`` and the rest of both."""
    return ["--spec-type", f"{context[1]},{assistant[1]}", *context[2:], *assistant[2:]]


def _canonical(policy: Policy) -> str:
    return canonical_spec(policy.kind, **policy.values)


def _part(part, role: str, spec: str) -> Policy:
    try:
        policy = part if isinstance(part, Policy) else parse_strategy(part)
    except StrategyError as e:
        raise StrategyError(f"strategy {spec!r}, its {role} part: {e}") from None
    if policy.composite:
        raise StrategyError(f"strategy {spec!r}: a hybrid's parts are plain specs, not another {policy.kind}")
    if role == "context" and not (policy.proposes and not policy.uses_assistant):
        raise StrategyError(f"strategy {spec!r}: {policy.spec!r} is not a drafter without a model "
                            "(the part before '+' must be lookup, copy, suffix or ngram)")
    if role == "assistant" and (not policy.uses_assistant or policy.probes_verification):
        raise StrategyError(f"strategy {spec!r}: {policy.spec!r} is not an assistant's rule (the part after '+' "
                            "drafts with the assistant: threshold, static, pmin, ...; not the oracle)")
    if policy.assistant_precision is not None:
        raise StrategyError(f"strategy {spec!r}: write the assistant's '@{policy.assistant_precision}' at the end")
    return policy


class Hybrid(Policy):
    """The context's draft when it has one, else the assistant's (llama.cpp's comma-separated ``--spec-type``)."""

    kind = "hybrid"
    summary = ("draft from the context (CONTEXT, no assistant pass) when it has a match, else with the assistant under "
               "ASSISTANT's rule: llama.cpp's comma-separated --spec-type")
    composite = True
    color = "#e8601c"  # orange-red (Tol rainbow): between its two parts' hues
    canonical = f"hybrid:{DEFAULT_CONTEXT}+{DEFAULT_ASSISTANT}"
    cite = "llama.cpp common/speculative.cpp (common_speculative_draft: n-gram drafters first, the first draft wins)"
    uses_assistant = True
    proposes = True

    def __init__(self, spec: str | None = None, context=DEFAULT_CONTEXT, assistant=DEFAULT_ASSISTANT):
        shown = spec or f"hybrid:{context}+{assistant}"
        self.from_context = _part(context, "context", shown)
        self.from_assistant = _part(assistant, "assistant", shown)
        # built from parts (a grid, the sliders): each part spelled the benchmark's way, as its own lane would be
        self.spec = spec if spec is not None else f"hybrid:{_canonical(self.from_context)}+{_canonical(self.from_assistant)}"
        a = self.from_assistant
        # what the benchmark's columns and the table depth read: the assistant rule's τ and KMAX
        self.values = {name: a.values[name] for name in ("tau", "k") if name in a.values}
        self.k = max(getattr(self.from_context, "k", 0), getattr(a, "k", 0))  # the app's lookahead limit holds both
        self.greedy_only = a.greedy_only
        self.needs_costs, self.reads_costs = a.needs_costs, a.reads_costs
        self.assistant_precision = None
        self.context = RunContext()
        self.reset()

    @classmethod
    def compose(cls, spec: str, rest: str) -> "Hybrid":
        parts = rest.split("+")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise StrategyError(f"strategy {spec!r}: write hybrid:CONTEXT+ASSISTANT, e.g. {cls.canonical}")
        return cls(spec, parts[0].strip(), parts[1].strip())

    @classmethod
    def template(cls) -> str:
        return "hybrid:CONTEXT+ASSISTANT"

    @classmethod
    def from_parts(cls, make: Callable[[str], Policy]) -> "Hybrid":
        """The default context drafter with ``make(kind)`` filling the assistant's kind (the Race tab's sliders)."""
        return cls(context=DEFAULT_CONTEXT, assistant=make(DEFAULT_ASSISTANT.split(":")[0]))

    @classmethod
    def grid(cls) -> list["Hybrid"]:
        """Every context drafter of ``CONTEXTS`` with every rule of ``ASSISTANTS`` and every other assistant rule at its
        canonical setting (those that can run here: ``disco`` needs its trained classifier)."""
        canonical = [k.canonical for k in policy_kinds() if k.uses_assistant and not k.proposes and k.kind != "oracle"
                     and k.unavailable() is None]
        assistants = list(dict.fromkeys(ASSISTANTS + tuple(canonical)))
        return [cls(context=c, assistant=a) for a in assistants for c in CONTEXTS]

    # -- the protocol, each hook answered by the part that drafts ------------------------------------

    def bind(self, context: RunContext) -> None:
        super().bind(context)
        self.from_context.bind(context)
        self.from_assistant.bind(context)

    def reset(self) -> None:
        self.last = "assistant"  # who drafted the iteration in progress
        self.from_context.reset()
        self.from_assistant.reset()

    def budget(self) -> int:
        return self.from_assistant.budget()

    def propose_budget(self) -> int:
        return self.from_context.propose_budget()

    def propose(self, ids: list[int], budget: int, eos) -> list[int]:
        tokens = self.from_context.propose(ids, budget, eos)
        self.last = "context" if tokens else "assistant"
        return tokens

    @property
    def threshold(self) -> float | None:
        return self.from_assistant.threshold

    def stop_after(self, step: DraftStep) -> bool:
        return self.from_assistant.stop_after(step)

    def drop(self, step: DraftStep) -> bool:
        return self.from_assistant.drop(step)

    def keep(self, steps: list[DraftStep]) -> int:
        return (self.from_context if self.last == "context" else self.from_assistant).keep(steps)

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        (self.from_context if self.last == "context" else self.from_assistant).update(steps, accepted)

    def llama_args(self) -> list[str] | None:
        """llama.cpp's flags for exactly this lane (its comma-separated ``--spec-type``), where both parts are llama.cpp's
        own rules (``ngram`` + ``pmin``); None otherwise."""
        parts = [getattr(p, "llama_args", None) for p in (self.from_context, self.from_assistant)]
        if None in parts:
            return None
        return join_llama_flags(*(f() for f in parts))

    def describe(self) -> str:
        return f"{self.from_context.describe()}; without a match: {self.from_assistant.describe()}"
