"""Lookahead policies: how many tokens the assistant drafts, when it stops, how that adapts.

A policy answers three questions for the engine and nothing else:
  * ``budget()``   the most tokens it will draft this iteration (before the length cap),
  * ``stop_after`` whether to stop after a drafted token, given its confidence,
  * ``update``     what to change after the target has verified the draft.
Each one is a small class, so a new drafting rule is one more class plus a line in ``parse_strategy``.

Strategy specs (the CLI's ``--strategy`` and the trace's ``strategy`` column) are kept verbatim:
``autoregressive``, ``static:K``, ``heuristic:K``, ``threshold:TAU[:KMAX]``, ``oracle[:KMAX]``, each optionally
followed by ``@model`` or ``@int8``: the assistant precision that lane drafts with (``disco.precision``; without
a suffix the lane uses the run's default assistant).
"""

from __future__ import annotations

from dataclasses import dataclass

# transformers' defaults for assisted generation (assistant_confidence_threshold, num_assistant_tokens)
DEFAULT_THRESHOLD = 0.4
DEFAULT_MAX_LOOKAHEAD = 20
MAX_LOOKAHEAD_LIMIT = 128  # beyond this a draft is never worth its cost; guards against typos like static:5000

DEFAULT_STRATEGIES = ("autoregressive", "static:5", "threshold:0.4:20")


class StrategyError(ValueError):
    """A strategy spec that cannot be parsed or is out of range (a user error, not a bug)."""


class Policy:
    """Base class: never drafts (this is the autoregressive baseline)."""

    kind = "autoregressive"
    uses_assistant = False
    greedy_only = False
    assistant_precision: str | None = None  # from a ``@model`` / ``@int8`` suffix; None = the run's default
    probes_verification = False  # the oracle only (see Oracle)

    def __init__(self, spec: str):
        self.spec = spec

    def budget(self) -> int:
        return 0

    @property
    def threshold(self) -> float | None:
        """The confidence threshold in force (None when the policy has none)."""
        return None

    def stop_after(self, confidence: float) -> bool:
        return False

    def reject_draft(self, position: int, token: int) -> bool:
        """Oracle hook: drop a drafted token before verification. Other policies never do."""
        return False

    def update(self, drafted: int, accepted: int) -> None:
        pass


class Static(Policy):
    """Always draft exactly K tokens (fewer only near the length limit or at EOS)."""

    kind = "static"
    uses_assistant = True

    def __init__(self, spec: str, k: int):
        super().__init__(spec)
        self.k = k

    def budget(self) -> int:
        return self.k


class Heuristic(Static):
    """transformers' 'heuristic' schedule: K += 2 after a fully accepted draft, else K = max(1, K - 1)."""

    kind = "heuristic"

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:  # nothing was drafted (length cap): nothing learned
            return
        self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)


class Threshold(Static):
    """Confidence-thresholded dynamic lookahead (transformers' assistant_confidence_threshold).

    Stop drafting as soon as the assistant's probability for the token it just drafted is below tau;
    that token is still verified. K is the maximum lookahead.
    """

    kind = "threshold"

    def __init__(self, spec: str, tau: float, k: int):
        super().__init__(spec, k)
        self.tau = tau

    @property
    def threshold(self) -> float:
        return self.tau

    def stop_after(self, confidence: float) -> bool:
        return confidence < self.tau


class Oracle(Static):
    """DISCO's upper bound (greedy only): draft exactly the tokens the target will accept.

    It knows the target's own greedy continuation (``reference``, token ids after the prompt) and
    drops the first drafted token that differs from it, so every verified draft is fully accepted.
    """

    kind = "oracle"
    greedy_only = True
    # the engine checks each draft against the very verification pass it will run (untimed), so every verified
    # oracle draft is accepted in any dtype, and re-derives ``reference`` when the lane's text leaves it
    probes_verification = True

    def __init__(self, spec: str, k: int):
        super().__init__(spec, k)
        self.reference: list[int] | None = None

    def reject_draft(self, position: int, token: int) -> bool:
        if self.reference is None:
            raise RuntimeError("oracle policy used without its reference continuation")
        return position >= len(self.reference) or self.reference[position] != token


def _int(text: str, what: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise StrategyError(f"strategy {spec!r}: {what} must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_LOOKAHEAD_LIMIT:
        raise StrategyError(f"strategy {spec!r}: {what} must be between 1 and {MAX_LOOKAHEAD_LIMIT}, got {value}")
    return value


def _tau(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise StrategyError(f"strategy {spec!r}: threshold must be a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:  # also rejects nan
        raise StrategyError(f"strategy {spec!r}: threshold must be in [0, 1], got {text}")
    return value


ASSISTANT_SUFFIXES = ("model", "int8")


def split_precision(spec: str) -> tuple[str, str | None]:
    """``static:5@int8`` -> (``static:5``, ``int8``); no suffix -> (spec, None)."""
    base, sep, suffix = spec.strip().partition("@")
    if not sep:
        return base, None
    suffix = suffix.strip().lower()
    if suffix not in ASSISTANT_SUFFIXES:
        raise StrategyError(f"strategy {spec!r}: unknown assistant precision {suffix!r} after '@' "
                            f"(use {' or '.join('@' + s for s in ASSISTANT_SUFFIXES)})")
    return base.strip(), suffix


def parse_strategy(spec: str) -> Policy:
    """Build a fresh policy from its spec. Raises StrategyError with a one-line message."""
    spec = spec.strip()
    base, precision = split_precision(spec)
    policy = _parse_base(base, spec)
    if precision is not None and not policy.uses_assistant:
        raise StrategyError(f"strategy {spec!r}: {policy.kind} uses no assistant, so it takes no '@{precision}'")
    policy.assistant_precision = precision
    return policy


def _parse_base(base: str, spec: str) -> Policy:
    name, *args = base.split(":")
    if name == "autoregressive" and not args:
        return Policy(spec)
    if name in ("static", "heuristic") and len(args) == 1:
        k = _int(args[0], "K", spec)
        return Static(spec, k) if name == "static" else Heuristic(spec, k)
    if name == "threshold" and len(args) in (1, 2):
        tau = _tau(args[0], spec)
        k = _int(args[1], "KMAX", spec) if len(args) == 2 else DEFAULT_MAX_LOOKAHEAD
        return Threshold(spec, tau, k)
    if name == "oracle" and len(args) <= 1:
        k = _int(args[0], "KMAX", spec) if args else DEFAULT_MAX_LOOKAHEAD
        return Oracle(spec, k)
    raise StrategyError(
        f"unknown strategy {spec!r}: use autoregressive, static:K, heuristic:K, threshold:TAU[:KMAX] or oracle[:KMAX] "
        "(optionally @model or @int8 for the assistant's precision)"
    )


@dataclass(frozen=True)
class StrategyInfo:
    """What the UI needs to know about each kind of policy (for menus and help)."""

    kind: str
    template: str
    help: str


STRATEGY_KINDS = (
    StrategyInfo("autoregressive", "autoregressive", "target alone, one token per forward pass (the baseline)"),
    StrategyInfo("static", "static:K", "always draft K tokens"),
    StrategyInfo("heuristic", "heuristic:K", "start at K; +2 after a fully accepted draft, else -1 (floor 1)"),
    StrategyInfo("threshold", "threshold:TAU:KMAX", "draft until the assistant's confidence < TAU, at most KMAX"),
    StrategyInfo("oracle", "oracle:KMAX", "draft exactly what the target will accept (greedy only; upper bound)"),
)
