"""transformers' online-adapted confidence threshold (PR #34156, ``AssistedCandidateGenerator``).

The rule, as transformers 5.24 runs it when scikit-learn is installed and the threshold is not zero:
  * drafting stops as for ``threshold``: after a token whose probability is below the threshold in force;
  * after each verification the drafted tokens' probabilities are kept with a match label, 1 for each
    accepted token and 0 for the first rejected one; the probabilities of later tokens are dropped;
  * once more than 5 labelled probabilities exist and both labels occur, the threshold becomes the ROC
    threshold (``sklearn.metrics.roc_curve`` with its defaults) minimising FPR + 3 * FNR, i.e. a false
    negative (stopping before a token that would have been accepted) costs three times a false positive;
  * the history starts empty for every generation (each ``generate`` call), at the threshold TAU0.
``tests/bench`` checks it against transformers' own ``generate`` (``hf:adaptive`` peer).
"""

from __future__ import annotations

import numpy as np

from disco.policies.base import KMAX, DraftStep, Param, Policy
from disco.policies.classic import DEFAULT_MAX_LOOKAHEAD, DEFAULT_THRESHOLD, KMAXES

MIN_SAMPLES = 5   # transformers: "len(self.probs) > 5"
FN_WEIGHT = 3.0   # transformers: costs = fpr + 3 * fnr


class Adaptive(Policy):
    kind = "adaptive"
    summary = "threshold adapted online: ROC over past drafts, minimising FPR + 3·FNR (transformers)"
    params = (Param("tau", "TAU0", float, 0.01, 1.0, DEFAULT_THRESHOLD, "starting confidence threshold", "threshold",
                    (0.2, 0.4, 0.6)),
              KMAX(DEFAULT_MAX_LOOKAHEAD, KMAXES))
    color = "#e69f00"  # orange
    canonical = "adaptive:0.4:20"
    cite = "transformers PR #34156 (assistant_confidence_threshold adapted with sklearn's roc_curve)"
    hf_roc_adaptation = True  # the peer must leave transformers' own adaptation on

    def reset(self) -> None:
        super().reset()
        self.probs: list[float] = []
        self.matches: list[int] = []

    @property
    def threshold(self) -> float:
        return self.tau

    def stop_after(self, step: DraftStep) -> bool:
        return step.prob < self.tau

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        self.probs.extend(s.prob for s in steps)
        self.matches.extend([1] * accepted)
        if len(self.probs) > len(self.matches):
            self.matches.append(0)
        del self.probs[len(self.matches):]
        if len(self.probs) > MIN_SAMPLES and 0 in self.matches and 1 in self.matches:
            from sklearn.metrics import roc_curve

            fpr, tpr, thresholds = roc_curve(self.matches, self.probs)
            self.tau = float(thresholds[int(np.argmin(fpr + FN_WEIGHT * (1 - tpr)))])

    def hf_kwargs(self) -> dict:
        return {"num_assistant_tokens": self.k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": self.values["tau"]}
