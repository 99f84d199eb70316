"""The policy protocol, typed parameters, the spec grammar and the registry of policy kinds.

A policy answers three questions for the iteration core (``disco.decode.core``) and nothing else:
  * ``budget()``         the most tokens it will draft this iteration (before the length cap),
  * ``stop_after(step)`` whether to stop after a drafted token, given that ``DraftStep`` (the token is verified),
  * ``drop(step)``       whether to stop *without* that token (the oracle; AdaEDL's pre-sampling check),
  * ``update(steps, accepted)`` what to change after the target has verified the draft.

A ``DraftStep`` carries only numbers that an exact greedy replay table can store (``disco.replay``):
the drafted token's probability, the draft distribution's entropy and top-2 margin, the index in
the draft and the running product of the probabilities. So every rule runs identically live and
in replay.

A policy kind also owns its metadata: its spec grammar (``kind:P1:P2`` with typed, ranged
parameters, trailing ones optional), help text, colour, the Sweep grid and the transformers
``generate`` arguments that reproduce it (where transformers has it). The CLI help, the lanes'
menus and sliders, the Sweep grid, plots, bench labels and the About table read it from here, so
adding a policy is one subclass (it registers itself) and its tests.

Specs are kept verbatim in the trace (``strategy`` column); ``canonical_spec`` spells one the way
the benchmark and the Sweep tab write it. A spec may end with ``@model``, ``@int8`` (torch) or ``@q4_0``
(llama.cpp): the assistant precision that lane drafts with (``disco.models.precision``; without one the run's
default).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from disco.errors import UserError

MAX_LOOKAHEAD_LIMIT = 128  # beyond this a draft is never worth its cost; guards against typos like static:5000
ASSISTANT_SUFFIXES = ("model", "int8", "q4_0")  # the lane's assistant (disco.models.precision; the pair checks its engine)


class StrategyError(UserError, ValueError):
    """A strategy spec that cannot be parsed or is out of range (a user error, not a bug)."""


@dataclass(frozen=True)
class DraftStep:
    """What a policy sees after the assistant drafted one token (all of it storable in a replay table)."""

    index: int          # 0-based index of this token in the current draft
    position: int       # its position in the generated output
    token: int
    prob: float         # the assistant's probability of the token (after the logits processors): its confidence
    entropy: float      # entropy of that draft distribution, in nats
    margin: float       # top-1 minus top-2 probability of that distribution
    cumulative: float   # product of ``prob`` over this draft so far, this token included
    top10: float = math.nan  # mass of the distribution's 10 likeliest tokens (llama.cpp's p-min renormalizes by it)

    @classmethod
    def first(cls, position: int, token: int, prob: float, entropy: float = math.nan, margin: float = math.nan,
              top10: float = math.nan) -> "DraftStep":
        return cls(0, position, token, prob, entropy, margin, prob, top10)

    def then(self, token: int, prob: float, entropy: float = math.nan, margin: float = math.nan,
             top10: float = math.nan) -> "DraftStep":
        """The step after this one in the same draft."""
        return DraftStep(self.index + 1, self.position + 1, token, prob, entropy, margin, self.cumulative * prob, top10)


@dataclass
class RunContext:
    """What a run tells its policy before the first iteration (``Policy.bind``)."""

    costs: Any = None                   # a disco.costs.model.CostModel, or None when no cost profile is known
    reference: list[int] | None = None  # the target's greedy continuation (the oracle's knowledge)
    sample: bool = False


@dataclass(frozen=True)
class Param:
    """One typed parameter of a policy's spec."""

    name: str           # attribute name on the policy (``tau``)
    token: str          # how the grammar writes it (``TAU``)
    type: type          # int or float
    lo: float
    hi: float
    default: Any = None  # None: required
    help: str = ""
    slider: str = ""     # the Race tab's shared slider that fills it: "k", "threshold" or "kmax"
    grid: tuple = ()     # values the benchmark's and the Sweep tab's default grid try

    def parse(self, text: str, spec: str) -> Any:
        text = text.strip()
        if self.type is int:
            try:
                value = int(text)
            except ValueError:
                raise StrategyError(f"strategy {spec!r}: {self.token} must be an integer, got {text!r}") from None
        else:
            try:
                value = float(text)
            except ValueError:
                raise StrategyError(f"strategy {spec!r}: {self.token} must be a number in "
                                    f"[{format_value(self.lo)}, {format_value(self.hi)}], got {text!r}") from None
        return self.check(value, spec, text)

    def check(self, value, spec: str, shown=None):
        """``value`` if it is within the parameter's range (nan is not), else a StrategyError naming ``spec``."""
        if not self.lo <= value <= self.hi:
            raise StrategyError(f"strategy {spec!r}: {self.token} must be between {format_value(self.lo)} and "
                                f"{format_value(self.hi)}, got {value if shown is None else shown}")
        return value


def format_value(value) -> str:
    """How specs spell a parameter: integers plainly, floats shortest (0.4, not 0.40000000000000002)."""
    if isinstance(value, bool):
        raise TypeError("a policy parameter is a number")
    if isinstance(value, int):
        return str(value)
    return f"{round(float(value), 6):g}"


def KMAX(default: int = 20, grid: tuple = (5, 10, 15, 20)) -> Param:
    return Param("k", "KMAX", int, 1, MAX_LOOKAHEAD_LIMIT, default, "the most tokens drafted per iteration", "kmax", grid)


_REGISTRY: dict[str, type["Policy"]] = {}


class Policy:
    """Base class of every lookahead policy. Subclasses set the class metadata and override the hooks."""

    kind: ClassVar[str] = ""
    summary: ClassVar[str] = ""       # one line: what it does (menus, CLI help, About)
    params: ClassVar[tuple[Param, ...]] = ()
    color: ClassVar[str] = "#000000"  # its hue in every plot (Okabe-Ito)
    canonical: ClassVar[str] = ""     # the spec drawn in the kind's pure hue (others get shades of it)
    cite: ClassVar[str] = ""          # where the rule comes from
    uses_assistant: ClassVar[bool] = True
    proposes: ClassVar[bool] = False             # drafts without a model, from the context (``propose``; prompt lookup)
    greedy_only: ClassVar[bool] = False
    probes_verification: ClassVar[bool] = False  # the oracle only (see Oracle)
    needs_costs: ClassVar[bool] = False          # cannot run without the run's cost profile (RunContext.costs)
    reads_costs: ClassVar[bool] = False          # uses the cost profile when the run has one (and runs without)
    in_default_grid: ClassVar[bool] = True
    composite: ClassVar[bool] = False            # its spec holds other kinds' specs (``compose`` parses it)
    batch_shared: ClassVar[bool] = False         # in a batch, engines keep one state for every sequence (SGLang's
                                                 # adaptive depth, a bandit over K): the batched replay shares one

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):
            _REGISTRY[cls.kind] = cls

    def __init__(self, spec: str | None = None, **values):
        self.values: dict[str, Any] = {}
        for p in self.params:
            value = values.pop(p.name, p.default)
            if value is None:
                raise StrategyError(f"strategy {self.kind!r}: {p.token} is required")
            value = p.type(value)
            self.values[p.name] = value
            setattr(self, p.name, value)
        if values:
            raise TypeError(f"{self.kind} has no parameter(s) {', '.join(values)}")
        self.spec = spec if spec is not None else canonical_spec(self.kind, **self.values)
        for p in self.params:  # a policy built from numbers (a grid, the sliders) is held to the grammar's ranges
            p.check(self.values[p.name], self.spec)
        self.assistant_precision: str | None = None  # from a ``@model`` / ``@int8`` suffix; None = run default
        self.context = RunContext()
        self.reset()

    # -- the protocol ------------------------------------------------------------------------------

    def bind(self, context: RunContext) -> None:
        """Called once by a run before its first iteration (then ``reset``); a kind that ``needs_costs`` refuses a run
        without a cost profile in one line."""
        if self.needs_costs and context.costs is None:
            raise StrategyError(f"strategy {self.spec!r} needs a cost profile (this machine's, from "
                                "'python -m disco profile', or --cost-profile flat:C); none is known yet")
        self.context = context
        self.reset()

    def reset(self) -> None:
        """Start the policy's own state afresh (parameters back to the spec's values)."""
        for name, value in self.values.items():
            setattr(self, name, value)

    @property
    def drafts(self) -> bool:
        """Whether this policy drafts at all (with the assistant or from the context)."""
        return self.uses_assistant or self.proposes

    def budget(self) -> int:
        return getattr(self, "k", 0) if self.uses_assistant else 0

    def propose_budget(self) -> int:
        """The most tokens a model-free draft (``propose``) may hold this iteration; ``budget()`` unless a policy drafts
        both ways (``hybrid``: its context drafter's length, while ``budget()`` is its assistant rule's)."""
        return self.budget()

    def propose(self, ids: list[int], budget: int, eos) -> list[int]:
        """A model-free draft of at most ``budget`` tokens from the context ``ids`` (prompt + output so far), for a
        policy that ``proposes``; none by default."""
        return []

    @property
    def threshold(self) -> float | None:
        """The threshold in force, for the trace's ``threshold`` column (None when the policy has none)."""
        return None

    def stop_after(self, step: DraftStep) -> bool:
        return False

    def drop(self, step: DraftStep) -> bool:
        """Whether to drop the token just drafted (not verified) and stop drafting: the oracle drops what the target
        would reject; a rule that judges the draft distribution before using its token drops it. Default: never."""
        return False

    def keep(self, steps: list[DraftStep]) -> int:
        """How many of the finished draft's tokens to send for verification (the rest cost their passes and are
        discarded). Default: all of them."""
        return len(steps)

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        pass

    def drafting_with(self, precision: str | None) -> "Policy":
        """This policy drafting with the assistant in ``precision`` (``@model`` / ``@int8`` on its spec, so two lanes
        that differ only in their assistant are two lanes); None, or a policy that uses no assistant, is unchanged."""
        if precision is None or not self.uses_assistant:
            return self
        if precision not in ASSISTANT_SUFFIXES:
            raise StrategyError(f"unknown assistant precision {precision!r} (use {' or '.join(ASSISTANT_SUFFIXES)})")
        self.spec = f"{self.spec.partition('@')[0]}@{precision}"
        self.assistant_precision = precision
        return self

    def describe(self) -> str:
        """One line of help with this policy's parameters filled in (``draft until ... < 0.4, at most 20``)."""
        text = self.summary
        for p in sorted(self.params, key=lambda p: -len(p.token)):  # KMAX before K
            text = re.sub(rf"\b{p.token}\b", f"{self.values[p.name]:g}", text)
        return text

    # -- metadata ------------------------------------------------------------------------------------

    @classmethod
    def template(cls) -> str:
        """The grammar, e.g. ``threshold:TAU[:KMAX]``."""
        out = cls.kind
        closing = ""
        for p in cls.params:
            if p.default is None:
                out += f":{p.token}"
            else:
                out += f"[:{p.token}"
                closing += "]"
        return out + closing

    @classmethod
    def compose(cls, spec: str, rest: str) -> "Policy":
        """A composite kind's policy from the text after ``kind:`` (only kinds with ``composite`` set)."""
        raise NotImplementedError

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this kind cannot run here (e.g. no trained classifier), or None."""
        return None

    def hf_kwargs(self) -> dict | None:
        """transformers ``generate`` arguments (besides ``assistant_model``) that run this policy, or None."""
        return None


def policy_kinds() -> list[type[Policy]]:
    """Every registered policy kind, in registration order (the baseline first)."""
    return list(_REGISTRY.values())


def policy_class(kind: str) -> type[Policy]:
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise StrategyError(f"unknown policy kind {kind!r}: use {grammar_line()}")
    return cls


def grammar_line() -> str:
    kinds = [cls.template() for cls in policy_kinds()]
    return ", ".join(kinds[:-1]) + " or " + kinds[-1] + " (optionally @model, @int8 or @q4_0 for the assistant's precision)"


def canonical_spec(kind: str, **values) -> str:
    """A spec spelled the benchmark's way: every parameter written out, floats shortest."""
    cls = policy_class(kind)
    if cls.composite:  # spelled by its parts (each canonical already when built from policies)
        return cls(**values).spec
    parts = [kind]
    for p in cls.params:
        value = values.get(p.name, p.default)
        if value is None:
            raise StrategyError(f"strategy {kind!r}: {p.token} is required")
        parts.append(format_value(p.type(value)))
    return ":".join(parts)


def split_precision(spec: str) -> tuple[str, str | None]:
    """``static:5@int8`` -> (``static:5``, ``int8``); no suffix -> (spec, None)."""
    base, sep, suffix = spec.strip().partition("@")
    if not sep:
        return base, None
    suffix = suffix.strip().lower()
    if "+" in suffix:
        raise StrategyError(f"strategy {spec!r}: the assistant's '@{suffix.split('+')[0]}' goes at the end of the spec, "
                            "after the hybrid's assistant part")
    if suffix not in ASSISTANT_SUFFIXES:
        raise StrategyError(f"strategy {spec!r}: unknown assistant precision {suffix!r} after '@' "
                            f"(use {' or '.join('@' + s for s in ASSISTANT_SUFFIXES)})")
    return base.strip(), suffix


def parse_strategy(spec: str) -> Policy:
    """Build a fresh policy from its spec. Raises StrategyError with a one-line message."""
    if not isinstance(spec, str):
        raise StrategyError(f"a strategy spec is text, got {type(spec).__name__}")
    spec = spec.strip()
    base, precision = split_precision(spec)
    name, *args = base.split(":")
    cls = _REGISTRY.get(name.strip())
    if cls is not None and cls.composite:  # a spec made of other specs (hybrid:CONTEXT+ASSISTANT)
        policy = cls.compose(spec, base.split(":", 1)[1] if args else "")
        return policy.drafting_with(precision) if precision is not None else policy
    required = sum(p.default is None for p in cls.params) if cls else 0
    if cls is None or not required <= len(args) <= len(cls.params):
        raise StrategyError(f"unknown strategy {spec!r}: use {grammar_line()}")
    values = {p.name: p.parse(text, spec) for p, text in zip(cls.params, args)}
    policy = cls(spec, **values)
    if precision is not None and not policy.uses_assistant:
        raise StrategyError(f"strategy {spec!r}: {policy.kind} uses no assistant, so it takes no '@{precision}'")
    policy.assistant_precision = precision
    return policy


def spec_kind(spec: str) -> str:
    """The kind of a spec (``threshold:0.4:20@int8`` -> ``threshold``) without validating it."""
    return spec.strip().partition("@")[0].split(":", 1)[0].strip()
