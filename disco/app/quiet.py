"""Race figures that are the machine's: each lane's live time beside what its own iterations cost on this machine
when quiet (this machine's measured pass costs, the This-machine tab's profile, applied to the lane's records: every
pass size is known), so a race run while something else used the cores (a browser rendering the page on the same
two cores, another job) is flagged and its headline taken from the figure that is true.

Why it matters (issue 27, measured on a 2-core Xeon): with Chromium on the same machine the page showed the target
alone at 4.6 tokens/s and ``static:5`` at 1.60x, where the command line gives 9.03 tokens/s and 0.99x: a pass loses
about the same absolute time to a busy core whatever its size, so the lane with the most passes (the target alone)
loses most and every speculative lane looks faster than it is. The quiet-cost figure does not move with the load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from disco.costs.model import QUIET_TOLERANCE as TOLERANCE


@dataclass
class QuietCheck:
    live_s: dict[str, float] = field(default_factory=dict)    # each lane's own clock
    quiet_s: dict[str, float] = field(default_factory=dict)   # its records under this machine's measured pass costs

    def ratio(self, strategy: str) -> float:
        q = self.quiet_s.get(strategy)
        return self.live_s[strategy] / q if q and q > 0 else math.nan

    def _ratios(self) -> list[float]:
        return [r for r in (self.ratio(s) for s in self.quiet_s) if r == r]

    @property
    def busy(self) -> bool:
        """A lane took more than ``TOLERANCE`` longer than its quiet cost: something else used the cores."""
        return any(r - 1 > TOLERANCE for r in self._ratios())

    @property
    def stale(self) -> bool:
        """No lane was slowed, but one ran more than ``TOLERANCE`` faster than its quiet cost: the profile's pass costs
        overstate this machine now (measured at a busier moment, or before a change), so the live clocks are the
        truer figures."""
        return not self.busy and any(1 - r > TOLERANCE for r in self._ratios())

    def speedup(self, strategy: str, baseline: str) -> float:
        """The quiet-cost speed-up of a lane over the baseline (NaN where either was not costed)."""
        a, b = self.quiet_s.get(baseline), self.quiet_s.get(strategy)
        return a / b if a and b else math.nan

    def worst(self) -> float:
        """The largest relative departure from the quiet cost, signed (+0.8 = 80 % slower than quiet)."""
        ratios = [r - 1 for r in self._ratios()]
        return max(ratios, key=abs) if ratios else math.nan


def check(decoders, profile, default_precision: str | None) -> QuietCheck | None:
    """The quiet-cost check of a race's lanes (None without this machine's profile for the engine, e.g. while it is
    still measured). A lane drafting with an assistant the profile did not measure is left out."""
    if profile is None:
        return None
    out = QuietCheck()
    for d in decoders:
        if not d.records:
            continue
        out.live_s[d.strategy] = d.records[-1].elapsed_ms / 1000.0
        precision = getattr(d.policy, "assistant_precision", None) or default_precision
        try:
            quiet_ms = profile.cost_model_near(precision).lane_ms(d.records, precision)
        except (KeyError, IndexError, AttributeError):
            continue
        if quiet_ms == quiet_ms:  # NaN: it drafted with an assistant the profile did not measure
            out.quiet_s[d.strategy] = quiet_ms / 1000.0
    return out if out.quiet_s else None
