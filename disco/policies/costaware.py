"""Cost-aware lookahead: draft one more token only while it is expected to pay for itself.

No hyperparameter. Costs are in target steps T(1) (one target pass over one token), from the run's cost
profile (``disco.costs``: measured on this machine, ``flat:C``, or a CSV). After drafting token j of the
iteration (1-based), with p_j its confidence and P_j = p_1 ... p_j the running product:
  * drafting token j+1 yields one more output token exactly when it and every draft before it are
    accepted; we estimate that probability by P_j * p_j (the freshest confidence stands in for the next,
    unseen one), and one output token is worth one target step (what it costs without speculation);
  * its marginal cost is one assistant step, c = A(1) / T(1), plus the extra verification cost of one more
    token, v_{j+1} = (T(j+2) - T(j+1)) / T(1) (the target is fed 1 + drafts tokens);
  * so keep drafting while P_j * p_j > c + v_{j+1}, up to KMAX.
The first draft of an iteration has expected gain at most 1; when c + v_1 >= 1 no draft can pay on this
machine and the policy drafts nothing (it runs as the target alone). Under ``flat:C`` (verification free,
v = 0) the rule is "continue while P_j * p_j > C".
"""

from __future__ import annotations

from disco.policies.base import KMAX, DraftStep, Policy
from disco.policies.classic import DEFAULT_MAX_LOOKAHEAD


def marginal_costs(costs, k: int) -> list[float]:
    """``marginal[j]``: what drafting token j+1 (0-based j) of an iteration costs, in target steps: one assistant step
    plus the extra verification of one more token (the target is fed 1 + drafts)."""
    step = costs.target_ms(1)
    c = costs.assistant_ms(1) / step
    return [c + (costs.target_ms(j + 2) - costs.target_ms(j + 1)) / step for j in range(k + 1)]


class CostAware(Policy):
    kind = "costaware"
    summary = "draft while P(this and every earlier draft accepted) > the next token's cost (cost profile)"
    params = (KMAX(DEFAULT_MAX_LOOKAHEAD, (10, 20)),)
    color = "#000000"  # black
    canonical = "costaware:20"
    cite = "our derivation (About tab); Leviathan et al. 2023 for the cost model"
    needs_costs = True

    def reset(self) -> None:
        super().reset()
        self.marginal: list[float] = []  # marginal[j]: cost of drafting token j+1 (0-based j), in target steps
        if self.context.costs is not None:
            self.marginal = marginal_costs(self.context.costs, self.k)

    def budget(self) -> int:
        if self.marginal and self.marginal[0] >= 1.0:
            return 0  # not even a sure first draft pays for itself here
        return self.k

    def stop_after(self, step: DraftStep) -> bool:
        nxt = step.index + 1  # 0-based index of the token we would draft next
        cost = self.marginal[nxt] if nxt < len(self.marginal) else self.marginal[-1]
        return step.cumulative * step.prob <= cost
