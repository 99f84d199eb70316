"""SGLang's adaptive speculation depth (``--speculative-adaptive``), at batch size 1.

SGLang moves its number of draft steps between a few candidates from an exponential moving average of how many
drafts the target accepted (read in sglang ``python/sglang/srt/speculative/adaptive_spec_params.py``,
``AdaptiveStepSlot``; PRs #21599, #23336, #24055). Its defaults for one running request, kept here:

* candidate depths 1, 3, 5, 7; the run starts at INIT (SGLang's ``--speculative-num-steps``) when it is one of them,
  else at the middle candidate; the average starts at INIT - 1;
* after every verification the average moves by 0.2 towards the drafts accepted in it (only while drafting);
* the depth is reconsidered only after 10 warm-up verifications, then every 5th;
* it steps down past a smaller candidate s while the average is at most s - 0.5 - 0.25 (the down hysteresis);
  otherwise it steps up past the current depth d while the average exceeds d - 0.5 (no up hysteresis).

SGLang's larger batch-size buckets (8, 32, 64 running requests: fewer and smaller candidates, down to no drafting)
have no counterpart in a single-sequence race. The depth is a fixed draft length (no confidence stop), as SGLang's
chain drafts with top-k 1.
"""

from __future__ import annotations

from disco.policies.base import DraftStep, Param, Policy

CANDIDATES = (1, 3, 5, 7)
EMA_ALPHA = 0.2
WARMUP = 10
INTERVAL = 5
DOWN_HYSTERESIS = -0.25
UP_HYSTERESIS = 0.0


class SGLangAdaptive(Policy):
    kind = "sglang"
    summary = "SGLang's adaptive depth: 1, 3, 5 or 7 drafts from a moving average of accepted drafts, starting at INIT"
    params = (Param("init", "INIT", int, 1, 7, 3, "the starting depth (SGLang's --speculative-num-steps)", "", (3,)),)
    color = "#ddcc77"  # sand (Tol)
    canonical = "sglang:3"
    batch_shared = True  # one state per server batch, as the engine keeps it
    cite = "SGLang --speculative-adaptive (srt/speculative/adaptive_spec_params.py, batch size 1)"

    def reset(self) -> None:
        super().reset()
        self.depth = self.init if self.init in CANDIDATES else CANDIDATES[len(CANDIDATES) // 2]
        self.average = float(self.depth - 1)
        self.verified = 0

    def budget(self) -> int:
        return self.depth

    def update(self, steps: list[DraftStep], accepted: int) -> None:
        if not steps:  # nothing was drafted (length cap): nothing learned
            return
        self.average = (1 - EMA_ALPHA) * self.average + EMA_ALPHA * accepted
        self.verified += 1
        if self.verified > WARMUP and (self.verified - WARMUP) % INTERVAL == 0:
            self.depth = self._reconsidered()

    def _reconsidered(self) -> int:
        """The depth the average now calls for: down while it is low enough for a smaller candidate, else up while it
        is high enough for a larger one."""
        i = CANDIDATES.index(self.depth)
        start = i
        while i > 0 and self.average <= CANDIDATES[i - 1] - 0.5 + DOWN_HYSTERESIS:
            i -= 1
        if i == start:
            while i < len(CANDIDATES) - 1 and self.average > CANDIDATES[i] - 0.5 + UP_HYSTERESIS:
                i += 1
        return CANDIDATES[i]

    def hf_kwargs(self) -> None:
        return None  # transformers has no such schedule
