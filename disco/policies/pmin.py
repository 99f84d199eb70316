"""llama.cpp's own drafting rule, as the vendored llama.cpp this project builds defines it (``--spec-draft-p-min``,
``--spec-draft-n-max``, ``--spec-draft-n-min``; read in ``common/speculative.cpp``, the ``draft-simple`` drafting
loop, llama.cpp 0c1e570 as vendored in llama-cpp-python 0.3.36), so it can race transformers' threshold rule:

* the confidence compared with P is the drafted token's probability *renormalized over the draft distribution's
  10 likeliest tokens* (llama.cpp's draft sampler keeps a top-k of 10 before its softmax), so it is never below
  transformers' full-vocabulary probability;
* a token below P is **dropped, not sent** (transformers' ``assistant_confidence_threshold`` sends it and then
  stops), and that can leave the draft empty: the first token is not guaranteed;
* at most NMAX tokens (llama.cpp's default 3); a finished draft shorter than NMIN (default 0) is discarded whole,
  and the iteration is a plain target step.

Where our loop still differs from llama.cpp's example program (its timed peer, ``disco.bench.llama_peer``): it
drafts greedily from its own top-10 sampler whatever the run's sampling settings, and re-decodes each verify batch
through the draft model. Under sampling, our rule reads the distribution our assistant drafts from.
"""

from __future__ import annotations

from disco.policies.base import KMAX, DraftStep, Param, Policy
from disco.policies.classic import KMAXES

LLAMA_N_MAX = 3  # llama.cpp's --spec-draft-n-max default


class PMin(Policy):
    kind = "pmin"
    summary = "llama.cpp's rule: drop and stop at the first draft whose top-10 probability < P, at most NMAX; drafts shorter than NMIN are not sent"
    params = (Param("p", "P", float, 0.0, 1.0, None, "llama.cpp's --spec-draft-p-min", "threshold", (0.2, 0.4, 0.6, 0.8)),
              Param("k", "NMAX", int, 1, KMAX().hi, LLAMA_N_MAX, "llama.cpp's --spec-draft-n-max", "kmax", KMAXES),
              Param("n_min", "NMIN", int, 0, KMAX().hi, 0, "llama.cpp's --spec-draft-n-min", "", (0,)))
    color = "#117733"  # green
    canonical = "pmin:0.4:3"
    cite = "llama.cpp common/speculative.cpp (draft-simple), --spec-draft-p-min / n-max / n-min"

    @property
    def threshold(self) -> float:
        return self.p

    def drop(self, step: DraftStep) -> bool:
        top10 = step.top10 if step.top10 == step.top10 and step.top10 > 0 else 1.0  # unknown mass: the plain prob
        return step.prob / top10 < self.p

    def keep(self, steps: list[DraftStep]) -> int:
        return len(steps) if len(steps) >= self.n_min else 0

    def llama_args(self) -> list[str]:
        """llama.cpp's flags for this setting (``llama-speculative-simple``, ``llama-server``)."""
        return ["--spec-type", "draft-simple", "--spec-draft-p-min", f"{self.p:g}", "--spec-draft-n-max", str(self.k),
                "--spec-draft-n-min", str(self.n_min)]
