"""The baseline and the rules transformers has had for years: static K, its heuristic schedule, a fixed
confidence threshold (DISCO's unsupervised form), and DISCO's oracle upper bound."""

from __future__ import annotations

from disco.policies.base import KMAX, MAX_LOOKAHEAD_LIMIT, DraftStep, Param, Policy

# transformers' defaults for assisted generation (assistant_confidence_threshold, num_assistant_tokens)
DEFAULT_THRESHOLD = 0.4
DEFAULT_MAX_LOOKAHEAD = 20
STATIC_KS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20)
TAUS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05 .. 0.95
KMAXES = (5, 10, 15, 20)


class Autoregressive(Policy):
    """Never drafts: the target alone (the baseline every speed-up is measured against)."""

    kind = "autoregressive"
    summary = "target alone, one token per forward pass (the baseline)"
    color = "#6b7280"  # grey
    canonical = "autoregressive"
    uses_assistant = False

    def hf_kwargs(self) -> dict:
        return {}


class Static(Policy):
    """Always draft exactly K tokens (fewer only near the length limit or at EOS)."""

    kind = "static"
    summary = "always draft K tokens"
    params = (Param("k", "K", int, 1, MAX_LOOKAHEAD_LIMIT, None, "tokens drafted per iteration", "k", STATIC_KS),)
    color = "#0072b2"  # blue
    canonical = "static:5"
    cite = "Leviathan et al. 2023; transformers num_assistant_tokens_schedule='constant'"

    def hf_kwargs(self) -> dict:
        return {"num_assistant_tokens": self.k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}


class Heuristic(Static):
    """transformers' 'heuristic' schedule: K += 2 after a fully accepted draft, else K = max(1, K - 1)."""

    kind = "heuristic"
    summary = "start at K; +2 after a fully accepted draft, else -1 (floor 1)"
    params = (Param("k", "K", int, 1, MAX_LOOKAHEAD_LIMIT, None, "the starting lookahead", "k", (5,)),)
    color = "#009e73"  # bluish green
    canonical = "heuristic:5"
    cite = "transformers num_assistant_tokens_schedule='heuristic'"

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        if not steps:  # nothing was drafted (length cap): nothing learned
            return
        self.k = self.k + 2 if accepted == len(steps) else max(1, self.k - 1)

    def hf_kwargs(self) -> dict:
        return {"num_assistant_tokens": self.values["k"], "num_assistant_tokens_schedule": "heuristic",
                "assistant_confidence_threshold": 0.0}


class Threshold(Policy):
    """Confidence-thresholded dynamic lookahead (transformers' ``assistant_confidence_threshold``; the unsupervised
    form of DISCO, Mamou et al. 2024, arXiv 2405.04304).

    Stop drafting as soon as the assistant's probability for the token it just drafted is below tau;
    that token is still verified. KMAX is the maximum lookahead.
    """

    kind = "threshold"
    summary = "draft until the assistant's confidence < TAU, at most KMAX"
    params = (Param("tau", "TAU", float, 0.0, 1.0, None, "confidence threshold", "threshold", TAUS),
              KMAX(DEFAULT_MAX_LOOKAHEAD, KMAXES))
    color = "#d55e00"  # vermillion: the dynamic (DISCO) lane
    canonical = "threshold:0.4:20"
    cite = "Mamou et al. 2024 (arXiv 2405.04304); transformers assistant_confidence_threshold"

    @property
    def threshold(self) -> float:
        return self.tau

    def stop_after(self, step: DraftStep) -> bool:
        return step.prob < self.tau

    def hf_kwargs(self) -> dict:
        return {"num_assistant_tokens": self.k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": self.tau}


class Oracle(Policy):
    """DISCO's upper bound (greedy only): draft exactly the tokens the target will accept.

    It knows the target's own greedy continuation (``context.reference``, token ids after the prompt) and
    drops the first drafted token that differs from it, so every verified draft is fully accepted.
    """

    kind = "oracle"
    summary = "draft exactly what the target will accept (greedy only; upper bound)"
    params = (KMAX(DEFAULT_MAX_LOOKAHEAD, (DEFAULT_MAX_LOOKAHEAD,)),)
    color = "#cc79a7"  # reddish purple
    canonical = "oracle:20"
    cite = "Mamou et al. 2024 (oracle speculation lookahead)"
    greedy_only = True
    # the live engine checks each draft against the very verification pass it will run (untimed), so every
    # verified oracle draft is accepted in any dtype, and re-derives ``reference`` when the lane's text leaves it
    probes_verification = True

    def __init__(self, spec: str | None = None, **values):
        super().__init__(spec, **values)
        self.reference: list[int] | None = None

    def bind(self, context) -> None:
        super().bind(context)
        if context.reference is not None:
            self.reference = list(context.reference)

    def drop(self, step: DraftStep) -> bool:
        if self.reference is None:
            raise RuntimeError("oracle policy used without its reference continuation")
        return step.position >= len(self.reference) or self.reference[step.position] != step.token
