"""DISCO's supervised rule: a classifier, trained on replay tables, decides after each draft whether to go on.

Mamou et al. 2024, "Dynamic Speculation Lookahead Accelerates Speculative Decoding of Large Language Models"
(arXiv 2405.04304): after each drafted token a classifier predicts whether drafting more will pay, and
drafting stops when its score falls below a threshold tuned on held-out data. Ours is a logistic
regression (scikit-learn, trained by ``python -m disco train``) over the ``DraftStep`` features below;
the label of a step is "the next drafted token would be accepted too" (it and every draft before it equal
the target's greedy continuation), read from the replay tables. The weights and the threshold live in a
JSON file (never a pickle): ``assets/disco-classifier.json`` by default, or ``DISCO_CLASSIFIER``.

Where to stop comes from the run's cost profile when it has one (the machine's, ``flat:C`` in replay): the score
estimates the probability that drafting one more token adds an output token, which pays while it exceeds that
token's marginal cost in target steps (one assistant step plus one more verified token; the cost-aware rule's
derivation, ``disco.policies.costaware``). A stop threshold tuned on one machine's costs therefore never travels
to another; the file's threshold is used only by runs that know no costs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from disco.policies.base import KMAX, DraftStep, Policy, StrategyError
from disco.policies.classic import DEFAULT_MAX_LOOKAHEAD
from disco.policies.costaware import marginal_costs

FEATURES = ("prob", "entropy", "margin", "index", "log_cumulative")
WEIGHTS_FORMAT = 1
DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent.parent / "assets" / "disco-classifier.json"


def step_features(step: DraftStep) -> list[float]:
    """The classifier's inputs for one draft step, in ``FEATURES`` order."""
    return [step.prob, step.entropy, step.margin, float(step.index), math.log(max(step.cumulative, 1e-12))]


def weights_path() -> Path:
    return Path(os.environ.get("DISCO_CLASSIFIER") or DEFAULT_WEIGHTS)


class ClassifierWeights:
    """A trained logistic regression as plain numbers: standardisation, coefficients, intercept, threshold."""

    def __init__(self, mean, scale, coef, intercept, threshold, meta=None):
        self.mean, self.scale, self.coef = [float(x) for x in mean], [float(x) for x in scale], [float(x) for x in coef]
        self.intercept, self.threshold = float(intercept), float(threshold)
        self.meta = dict(meta or {})
        if not (len(self.mean) == len(self.scale) == len(self.coef) == len(FEATURES)):
            raise ValueError(f"expected {len(FEATURES)} weights per list")
        if not all(math.isfinite(x) for x in [*self.mean, *self.scale, *self.coef, self.intercept, self.threshold]):
            raise ValueError("weights must be finite numbers")
        if any(s <= 0 for s in self.scale):
            raise ValueError("scales must be positive")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("threshold must be in [0, 1]")

    def score(self, x: list[float]) -> float:
        z = self.intercept + sum(w * (v - m) / s for w, v, m, s in zip(self.coef, x, self.mean, self.scale))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def to_dict(self) -> dict:
        return {"format": WEIGHTS_FORMAT, "model": "logistic_regression", "features": list(FEATURES),
                "mean": self.mean, "scale": self.scale, "coef": self.coef, "intercept": self.intercept,
                "threshold": self.threshold, "meta": self.meta}

    @classmethod
    def from_dict(cls, data) -> "ClassifierWeights":
        if not isinstance(data, dict) or data.get("format") != WEIGHTS_FORMAT:
            raise ValueError(f"not a format-{WEIGHTS_FORMAT} DISCO classifier")
        if data.get("features") != list(FEATURES):
            raise ValueError(f"features must be {list(FEATURES)}, got {data.get('features')!r}")
        return cls(data["mean"], data["scale"], data["coef"], data["intercept"], data["threshold"], data.get("meta"))

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "ClassifierWeights":
        path = Path(path) if path else weights_path()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise StrategyError(f"no DISCO classifier at {path}: train one with 'python -m disco train'") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise StrategyError(f"cannot read the DISCO classifier {path}: {exc}") from None
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise StrategyError(f"the DISCO classifier {path} is malformed: {exc}") from None


_CACHE: dict[tuple[str, float], ClassifierWeights] = {}


def _weights() -> ClassifierWeights:
    path = weights_path()
    try:
        key = (str(path), path.stat().st_mtime)
    except OSError:
        key = (str(path), -1.0)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = ClassifierWeights.load(path)
    return _CACHE[key]


def weights_summary() -> dict | None:
    """Which classifier ``disco`` lanes use (for reports): its file, threshold and training profile; None if none loads."""
    try:
        weights = _weights()
    except StrategyError:
        return None
    meta = weights.meta or {}
    path = weights_path()
    try:
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return {"path": shown, "threshold": weights.threshold, "cost_profile": meta.get("cost_profile"),
            "assistant_precision": meta.get("assistant_precision"), "trained": meta.get("trained"),
            "test_roc_auc": (meta.get("test") or {}).get("roc_auc")}


class Disco(Policy):
    kind = "disco"
    summary = "DISCO: a trained classifier (python -m disco train) decides after each draft whether to go on"
    params = (KMAX(DEFAULT_MAX_LOOKAHEAD, (10, 20)),)
    color = "#882255"  # wine
    canonical = "disco:20"
    cite = "Mamou et al. 2024, DISCO (arXiv 2405.04304)"
    reads_costs = True

    def __init__(self, spec: str | None = None, weights: ClassifierWeights | None = None, **values):
        # a missing or malformed file is a StrategyError when the spec is parsed
        self.weights = weights if weights is not None else _weights()
        super().__init__(spec, **values)

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            _weights()
        except StrategyError as exc:
            return str(exc)
        return None

    def reset(self) -> None:
        super().reset()
        costs = self.context.costs
        self.marginal: list[float] | None = marginal_costs(costs, self.k) if costs is not None else None

    @property
    def threshold(self) -> float:
        """The bar the first stop decision holds the score to: the second token's marginal cost with a cost
        profile, else the file's threshold."""
        return self.marginal[1] if self.marginal else self.weights.threshold

    def budget(self) -> int:
        if self.marginal and self.marginal[0] >= 1.0:
            return 0  # not even a sure first draft pays for itself here (as for costaware)
        return self.k

    def stop_after(self, step: DraftStep) -> bool:
        score = self.weights.score(step_features(step))
        if self.marginal is None:
            return score < self.weights.threshold
        nxt = step.index + 1  # the token drafting on would add
        return score <= self.marginal[min(nxt, len(self.marginal) - 1)]
