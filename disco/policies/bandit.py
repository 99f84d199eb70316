"""An online bandit over drafting settings: no K or τ chosen offline.

BanditSpec (Hou et al. 2025, arXiv 2505.15141) and TapOut (arXiv 2511.02017) pick a speculation setting per step
with a multi-armed bandit, so that nothing is tuned on a benchmark beforehand. Here each iteration plays one arm of
a fixed menu that spans the settings the other rules are tuned over:

* static K for K = 1, 2, 4, 8 (capped at KMAX), and
* a confidence threshold τ = 0.2, 0.4, 0.6, 0.8 with at most KMAX drafts;

and is rewarded with what the iteration produced per unit of its cost: (accepted + 1) output tokens over the
iteration's cost in target steps, from the run's cost profile (one target pass over 1 + drafts tokens, one
assistant step per draft). The arm played is the one with the highest upper confidence bound (UCB1, Auer et al.
2002): its mean reward plus σ·sqrt(2 ln t / n), where n is how often it was played, t the iterations so far and σ
the spread of all rewards seen in this run (the reward's own scale, so no exploration constant is chosen either).
Each arm is played once first, in the order above. Everything is a function of the verification outcomes, so a
live run and its exact replay play the same arms.
"""

from __future__ import annotations

import math
import statistics

from disco.policies.base import KMAX, DraftStep, Policy
from disco.policies.classic import DEFAULT_MAX_LOOKAHEAD

STATIC_ARMS = (1, 2, 4, 8)
THRESHOLD_ARMS = (0.2, 0.4, 0.6, 0.8)


class Bandit(Policy):
    kind = "bandit"
    summary = "an online bandit (UCB1) over static K 1/2/4/8 and τ 0.2/0.4/0.6/0.8, at most KMAX, rewarded with " \
              "tokens per unit of cost (cost profile)"
    params = (KMAX(DEFAULT_MAX_LOOKAHEAD, (20,)),)
    color = "#aa4499"  # purple (Tol)
    canonical = "bandit:20"
    batch_shared = True  # one state per server batch, as the engine keeps it
    cite = "BanditSpec (arXiv 2505.15141), TapOut (arXiv 2511.02017); UCB1 (Auer et al. 2002)"
    needs_costs = True

    def reset(self) -> None:
        super().reset()
        # an arm is (budget, tau): tau 0 = never stop on confidence
        self.arms = list(dict.fromkeys([(min(k, self.k), 0.0) for k in STATIC_ARMS] +
                                       [(self.k, tau) for tau in THRESHOLD_ARMS]))
        self.plays = [0] * len(self.arms)
        self.totals = [0.0] * len(self.arms)
        self.rewards: list[float] = []
        self.played: list[int] = []  # the arm of each iteration, in order (the regret report reads it)
        self.arm = 0

    def _choose(self) -> int:
        for i, n in enumerate(self.plays):
            if n == 0:
                return i
        t = sum(self.plays)
        spread = statistics.pstdev(self.rewards) if len(self.rewards) > 1 else 0.0
        return max(range(len(self.arms)),
                   key=lambda i: self.totals[i] / self.plays[i] + spread * math.sqrt(2 * math.log(t) / self.plays[i]))

    def budget(self) -> int:
        self.arm = self._choose()
        return self.arms[self.arm][0]

    @property
    def threshold(self) -> float | None:
        return self.arms[self.arm][1] or None

    def stop_after(self, step: DraftStep) -> bool:
        return step.prob < self.arms[self.arm][1]

    def reward(self, drafted: int, accepted: int) -> float:
        """Output tokens per target step of cost for one iteration (the cost profile's passes)."""
        costs = self.context.costs
        step = costs.target_ms(1)
        cost = costs.target_ms(1 + drafted) / step + drafted * costs.assistant_ms(1) / step
        return (accepted + 1) / cost

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        if not steps:  # nothing was drafted (length cap): the arm was not tried
            return
        r = self.reward(len(steps), accepted)
        self.plays[self.arm] += 1
        self.totals[self.arm] += r
        self.rewards.append(r)
        self.played.append(self.arm)

    def describe(self) -> str:
        return f"an online bandit (UCB1) over static K 1/2/4/8 and τ 0.2/0.4/0.6/0.8, at most {self.k} drafts"
