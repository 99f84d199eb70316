"""AdaEDL: early draft stopping on an entropy-based lower bound of the acceptance probability.

Agrawal et al. 2024, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large Language Models via an
Entropy-based Lower Bound on Token Acceptance Probability" (arXiv 2410.18351). The probability that the
target accepts a token drawn from the draft distribution q is bounded below by ``1 - sqrt(gamma * H(q))``
(H in nats). Before using a drafted token the rule checks that bound against lambda and stops, without
the token, when the bound is below it. lambda adapts online after each verification: a running
acceptance rate AR = beta1 * AR + (1 - beta1) * accepted / drafted; lambda' = lambda + eps when AR is
below the target rate alpha (stop earlier), lambda - eps when the whole draft was accepted (the draft
could have gone on), else lambda; then lambda = beta2 * lambda + (1 - beta2) * lambda'.

The constants (gamma 0.2, beta1 0.5, beta2 0.9, eps 0.01, alpha 0.9) are the paper's as reported by public
re-implementations; the paper's PDF was not readable from this project's machine, so they are our
reading, not a verified copy. Greedy decoding uses the temperature-1 distribution (a one-hot
distribution has no entropy), which is what the engine's draft distribution is.
"""

from __future__ import annotations

import math

from disco.policies.base import KMAX, DraftStep, Param, Policy
from disco.policies.classic import DEFAULT_MAX_LOOKAHEAD, KMAXES

GAMMA = 0.2
BETA1 = 0.5
BETA2 = 0.9
EPSILON = 0.01
TARGET_RATE = 0.9


def acceptance_bound(entropy: float, gamma: float = GAMMA) -> float:
    """AdaEDL's lower bound on the probability that a token drafted from a distribution of this entropy is accepted."""
    return 1.0 - math.sqrt(max(0.0, gamma * entropy))


class Entropy(Policy):
    kind = "entropy"
    summary = "AdaEDL: stop when 1 − √(γ·entropy) < LAMBDA (LAMBDA adapted online), at most KMAX"
    params = (Param("lam", "LAMBDA", float, 0.0, 1.0, None, "starting lower-bound threshold", "threshold",
                    (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)),
              KMAX(DEFAULT_MAX_LOOKAHEAD, KMAXES))
    color = "#56b4e9"  # sky blue
    canonical = "entropy:0.4:20"
    cite = "Agrawal et al. 2024, AdaEDL (arXiv 2410.18351)"

    def reset(self) -> None:
        super().reset()
        self.rate = 1.0  # the running acceptance rate AR (optimistic start: no evidence yet)

    def drop(self, step: DraftStep) -> bool:
        return acceptance_bound(step.entropy) < self.lam

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        if not steps:
            return
        self.rate = BETA1 * self.rate + (1 - BETA1) * accepted / len(steps)
        if self.rate < TARGET_RATE:
            target = self.lam + EPSILON
        elif accepted == len(steps):
            target = self.lam - EPSILON
        else:
            target = self.lam
        self.lam = min(1.0, max(0.0, BETA2 * self.lam + (1 - BETA2) * target))
