"""SpecDec++'s stopping rule: stop once the draft probably already holds a rejection.

Huang et al. 2024, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths" (arXiv
2405.19715): with a_i the estimated probability that draft token i is accepted, stop after token j when
``1 - prod_{i<=j} a_i > H``. SpecDec++ trains an acceptance head on the draft model's hidden states; here
a_i is the assistant's confidence in token i (what a replay table stores), so the rule reads the
``DraftStep``'s running product. A larger H drafts longer.
"""

from __future__ import annotations

from disco.policies.base import KMAX, DraftStep, Param, Policy
from disco.policies.classic import DEFAULT_MAX_LOOKAHEAD, KMAXES


class Cumulative(Policy):
    kind = "cumulative"
    summary = "SpecDec++: stop when 1 − ∏ confidences so far > H, at most KMAX"
    params = (Param("h", "H", float, 0.0, 1.0, None, "tolerated probability of a rejection in the draft", "threshold",
                    (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)),
              KMAX(DEFAULT_MAX_LOOKAHEAD, KMAXES))
    color = "#8c6d31"  # brown
    canonical = "cumulative:0.5:20"
    cite = "Huang et al. 2024, SpecDec++ (arXiv 2405.19715)"

    def stop_after(self, step: DraftStep) -> bool:
        return 1.0 - step.cumulative > self.h
