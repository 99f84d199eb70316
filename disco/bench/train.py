"""Train DISCO's stopping classifier from replay tables (``python -m disco train``).

A sample is one draft step: the assistant's greedy chain from output position p, token j, described by the
features a policy sees (``disco.policies.classifier.FEATURES``: probability, entropy, top-2 margin, index in
the draft, log of the running product). Its label is 1 when drafting one more token would pay, i.e. chain
tokens 0..j+1 all equal the target's greedy continuation from p (DISCO's "continue" label, read from the
oracle's knowledge), else 0. Samples come from every position a draft can start at, up to KMAX deep.

The model is scikit-learn's ``StandardScaler`` + ``LogisticRegression``; it is saved as plain numbers in
JSON (``ClassifierWeights``), never a pickle. Its stop threshold is chosen on the train split by replaying
``disco:KMAX`` under the cost profile for each candidate threshold (best geometric-mean speed-up). Metrics
on the test split (ROC AUC, accuracy, the replay speed-up) are stored beside the weights.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from disco import cache, suites
from disco.costs import measure as cost_measure, model as cost_mod
from disco.errors import InputError
from disco.policies import AUTOREGRESSIVE, Autoregressive, DraftStep
from disco.policies.classifier import (  # noqa: F401  (DEFAULT_WEIGHTS: the command's default, disco.bench.commands)
    DEFAULT_WEIGHTS, FEATURES, ClassifierWeights, Disco, step_features,
)
from disco.replay.run import replay_many
from disco.replay.tables import ChainEnded
from disco.tables import cluster, fitting as prompt_fit
from disco.tables.identity import PairSpec
from disco.tables.phase import Here, TablePhase
from disco.tables.workers import OnRay

# 0.05 steps, and finer below 0.05: with a cheap draft (flat:0.05) the best threshold sits near the draft's cost
THRESHOLDS = (0.01, 0.02, 0.03, *(round(0.05 * i, 2) for i in range(1, 20)))


def samples(table, max_new_tokens: int, kmax: int) -> tuple[list[list[float]], list[int]]:
    """(features, labels) of every draft step a replay of this table can meet, up to ``kmax`` deep."""
    ref = table.reference_for(max_new_tokens)
    xs, ys = [], []
    for p in range(0, min(max_new_tokens - 1, len(ref))):
        step = None
        ok = True  # chain tokens 0..j-1 all equal the reference
        budget = min(kmax, max_new_tokens - p - 1)  # the core's length cap
        for j in range(budget):
            try:
                token, prob, entropy, margin, top10 = table.features(p, j)
            except ChainEnded:  # the chain ended (EOS) before token j
                break
            step = (DraftStep.first(p, token, prob, entropy, margin, top10) if step is None
                    else step.then(token, prob, entropy, margin, top10))
            if j + 1 >= budget or p + j + 1 >= len(ref) or token in table.eos:
                break  # no further draft would be made, so "continue" has no label
            ok = ok and token == ref[p + j]
            try:
                nxt = table.features(p, j + 1)[0]
            except ChainEnded:
                break
            xs.append(step_features(step))
            ys.append(int(ok and nxt == ref[p + j + 1]))
    return xs, ys


def fit(xs: list[list[float]], ys: list[int], threshold: float = 0.5, meta: dict | None = None) -> ClassifierWeights:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if len(set(ys)) < 2:
        raise ValueError(f"training needs both labels; got {len(ys)} samples, all labelled {ys[0] if ys else '-'}")
    x = np.asarray(xs, dtype=float)
    scaler = StandardScaler().fit(x)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    model = LogisticRegression(max_iter=1000).fit((x - scaler.mean_) / scale, np.asarray(ys))
    return ClassifierWeights(scaler.mean_.tolist(), scale.tolist(), model.coef_[0].tolist(), float(model.intercept_[0]),
                             threshold, meta)


def _with_threshold(weights: ClassifierWeights, threshold: float) -> ClassifierWeights:
    return ClassifierWeights(weights.mean, weights.scale, weights.coef, weights.intercept, threshold, weights.meta)


def replay_speedup(tables: list, weights: ClassifierWeights, kmax: int, max_new_tokens: int, costs) -> float:
    """Geometric-mean speed-up over autoregressive of ``disco:kmax`` with these weights, replayed under ``costs``."""
    logs = []
    for table in tables:
        spec = f"disco:{kmax}"
        res = replay_many(table, [Autoregressive(), Disco(spec, weights=weights, k=kmax)], max_new_tokens, costs)
        ar, ours = res[AUTOREGRESSIVE].records[-1].elapsed_ms, res[spec].records[-1].elapsed_ms
        logs.append(math.log(ar / ours))
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def metrics(weights: ClassifierWeights, xs, ys) -> dict:
    from sklearn.metrics import roc_auc_score

    if not ys:
        return {"samples": 0}
    scores = [weights.score(x) for x in xs]
    out = {"samples": len(ys), "positive_rate": float(np.mean(ys)),
           "accuracy": float(np.mean([(s >= weights.threshold) == bool(y) for s, y in zip(scores, ys)]))}
    out["roc_auc"] = float(roc_auc_score(ys, scores)) if len(set(ys)) == 2 else math.nan
    return out


def train(train_tables: dict, test_tables: dict, costs, max_new_tokens: int, kmax: int = 20,
          meta: dict | None = None, log=lambda msg: None) -> ClassifierWeights:
    """Fit on ``train_tables`` (name -> ReplayTable), choose the stop threshold on them by replay under ``costs``,
    and record metrics on ``test_tables``."""
    xs, ys = [], []
    for table in train_tables.values():
        x, y = samples(table, max_new_tokens, kmax)
        xs += x
        ys += y
    log(f"{len(ys)} training samples from {len(train_tables)} prompts ({np.mean(ys) if ys else math.nan:.2f} positive)")
    weights = fit(xs, ys)
    tables = list(train_tables.values())
    tried = {t: replay_speedup(tables, _with_threshold(weights, t), kmax, max_new_tokens, costs) for t in THRESHOLDS}
    best = max(tried, key=lambda t: (tried[t], -abs(t - 0.5)))
    log(f"stop threshold {best} (train replay speed-up {tried[best]:.3f}x)")
    weights = _with_threshold(weights, best)
    tx, ty = [], []
    for table in test_tables.values():
        x, y = samples(table, max_new_tokens, kmax)
        tx += x
        ty += y
    info = dict(meta or {})
    info.update(
        trained=datetime.now(timezone.utc).isoformat(timespec="seconds"), kmax=kmax, max_new_tokens=max_new_tokens,
        features=list(FEATURES), label="chain tokens 0..j+1 equal the target's greedy continuation",
        train_prompts=sorted(train_tables), test_prompts=sorted(test_tables),
        threshold_search={format(t, "g"): round(v, 4) for t, v in tried.items()},
        train=metrics(weights, xs, ys), test=metrics(weights, tx, ty),
        train_replay_speedup=tried[best],
        test_replay_speedup=(replay_speedup(list(test_tables.values()), weights, kmax, max_new_tokens, costs)
                             if test_tables else math.nan),
    )
    try:
        import sklearn

        info["sklearn"] = sklearn.__version__
    except ImportError:  # pragma: no cover - fit() needed it
        pass
    weights.meta = info
    return weights


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# train


@dataclass(frozen=True)
class TrainConfig:
    """What one training run uses (checked): the pair, the prompts (train split fitted, test split measured), the
    tokens per prompt, the deepest draft step sampled, the cost profile the stop threshold is tuned under."""

    spec: PairSpec
    selection: object              # suites.selection_from_args
    fitting: object                # the length rule (disco.tables.fitting)
    cache_dir: Path
    max_new_tokens: int = 48
    kmax: int = 20
    cost_profile: str = "measured"
    ray: object = None             # a Ray cluster's config (disco.tables.cluster), or None
    progress: bool = True
    command: str = "python -m disco train"

    @classmethod
    def from_args(cls, args) -> "TrainConfig":
        """The command's arguments, checked (one line for a bad one)."""
        if not 1 <= args.kmax <= 64:
            raise InputError(f"--kmax must be between 1 and 64, got {args.kmax}")
        if not 2 <= args.max_new_tokens <= 512:
            raise InputError(f"--max-new-tokens must be between 2 and 512, got {args.max_new_tokens}")
        out = args.out.expanduser()
        if out.is_dir() or not out.resolve().parent.is_dir():
            raise InputError(f"cannot write {out}: give a file in an existing folder")
        return cls(PairSpec.from_args(args), suites.selection_from_args(args), prompt_fit.fitting_from_args(args),
                   args.cache_dir or cache.tables_dir(), args.max_new_tokens, args.kmax,
                   cost_mod.check_profile(args.cost_profile), cluster.config_from_args(args), not args.no_progress,
                   "python -m disco train " + " ".join(sys.argv[2:]))


def run(config: TrainConfig, log=_log) -> ClassifierWeights:
    """The tables of the selected prompts (on Ray if asked; what training reads of a table is the chain from every
    position, as deep as it agrees + 1), then the fit on the train split, measured on the test split."""
    prompts = suites.pick(config.selection).prompts
    if not any(p.split == "train" for p in prompts):
        raise InputError("the selected prompts hold no train-split prompt")
    phase = TablePhase(config.spec, config.fitting, config.cache_dir, config.max_new_tokens)
    if config.ray is not None:
        phase.using(OnRay(config.ray, config.progress, log)).ensure(
            prompts, [], fill=functools.partial(samples, max_new_tokens=config.max_new_tokens, kmax=config.kmax))
    pair = config.spec.load(log=log)
    phase = phase.using(Here(pair, config.progress))
    done = phase.ensure(prompts, [])
    tables, prompts, skipped = done.tables, done.prompts, phase.encoder.skipped
    if skipped:
        log(f"skipped {len(skipped)} prompts that do not fit: {', '.join(list(skipped)[:5])}")
    which = {p.id: p.split for p in prompts}
    costs = cost_mod.resolve(config.cost_profile, measured=lambda: cost_measure.cached_costs(
        pair, [phase.ids(p) for p in prompts], config.kmax), precision=pair.assistant_precision)
    meta = dict(pair.describe())
    meta.update(cost_profile=config.cost_profile, command=config.command)
    weights = train({k: t for k, t in tables.items() if which[k] == "train"},
                    {k: t for k, t in tables.items() if which[k] == "test"},
                    costs, config.max_new_tokens, config.kmax, meta, log)
    for t in tables.values():
        if t.dirty:
            t.save()
    return weights


def cmd_train(args) -> int:
    """``python -m disco train``: config -> training -> the weights file, and one line on how they did."""
    weights = run(TrainConfig.from_args(args))
    out = args.out.expanduser()
    out.write_text(json.dumps(weights.to_dict(), indent=1) + "\n")
    test = weights.meta["test"]
    _log(f"wrote {out}: threshold {weights.threshold:g}; test split: ROC AUC {test.get('roc_auc', math.nan):.3f}, "
         f"accuracy {test.get('accuracy', math.nan):.3f} on {test.get('samples', 0)} samples, replay speed-up "
         f"{weights.meta['test_replay_speedup']:.3f}x")
    return 0
