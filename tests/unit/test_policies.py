"""The stopping rules on hand-made draft steps, their metadata, and lossless greedy decoding for every kind."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from disco.costs.model import CostModel, flat
from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.policies import (
    DraftStep, RunContext, StrategyError, canonical_spec, grammar_line, parse_strategy, policy_kinds,
)
from disco.policies.classifier import ClassifierWeights, step_features
from disco.policies.entropy import acceptance_bound
from disco.decode.race import run_all
from disco.models import encode_prompt

NEW_KINDS = ("adaptive", "entropy", "cumulative", "costaware", "disco")


def steps(*probs, entropies=None, margins=None) -> list[DraftStep]:
    out = []
    for i, p in enumerate(probs):
        h = entropies[i] if entropies else 0.5
        m = margins[i] if margins else 0.5
        out.append(DraftStep.first(10, 100 + i, p, h, m) if not out else out[-1].then(100 + i, p, h, m))
    return out


def bound(spec: str, costs=None):
    policy = parse_strategy(spec)
    policy.bind(RunContext(costs=costs))
    return policy


def test_draft_steps_carry_index_position_and_running_product():
    s = steps(0.9, 0.5, 0.8)
    assert [x.index for x in s] == [0, 1, 2] and [x.position for x in s] == [10, 11, 12]
    assert s[-1].cumulative == pytest.approx(0.9 * 0.5 * 0.8)


def test_every_kind_owns_its_metadata():
    kinds = [cls.kind for cls in policy_kinds()]
    assert kinds[:5] == ["autoregressive", "static", "heuristic", "threshold", "oracle"]
    assert set(NEW_KINDS) <= set(kinds)
    for cls in policy_kinds():
        assert cls.summary and cls.color.startswith("#") and cls.canonical
        assert parse_strategy(cls.canonical).spec == cls.canonical
        assert cls.template().startswith(cls.kind) and cls.template() in grammar_line()
        for p in cls.params:
            assert p.lo <= (p.default if p.default is not None else p.lo) <= p.hi and p.help
            assert all(p.lo <= v <= p.hi for v in p.grid)
    assert len({cls.color for cls in policy_kinds()}) == len(kinds)  # one hue per kind
    assert canonical_spec("threshold", tau=0.4) == "threshold:0.4:20"
    assert canonical_spec("entropy", lam=0.30000000000000004, k=5) == "entropy:0.3:5"


@pytest.mark.parametrize("spec,message", [
    ("entropy", "unknown strategy"), ("entropy:1.5", "LAMBDA must be between 0 and 1"),
    ("cumulative:x", "H must be a number"), ("adaptive:0", "TAU0 must be between 0.01 and 1"),
    ("costaware:0", "KMAX must be between 1 and 128"), ("disco:5:5", "unknown strategy"),
    ("adaptive:0.4:20:1", "unknown strategy"),
])
def test_bad_specs_of_the_new_kinds_are_one_line_errors(spec, message):
    with pytest.raises(StrategyError, match=message):
        parse_strategy(spec)


def test_threshold_stops_below_tau_only():
    t = bound("threshold:0.5:20")
    assert [t.stop_after(s) for s in steps(0.5, 0.49, 0.9)] == [False, True, False]


def test_adaptive_follows_transformers_labels_and_roc_rule():
    from sklearn.metrics import roc_curve

    a = bound("adaptive:0.4:20")
    a.update(steps(0.9, 0.8, 0.3), accepted=2)  # two accepted, the first rejected one labelled 0
    assert (a.probs, a.matches, a.tau) == ([0.9, 0.8, 0.3], [1, 1, 0], 0.4)  # < 6 samples: tau unchanged
    a.update(steps(0.95, 0.6, 0.2, 0.7), accepted=1)  # 0.2 and 0.7 come after the first rejection: dropped
    assert a.probs == [0.9, 0.8, 0.3, 0.95, 0.6] and a.matches == [1, 1, 0, 1, 0]
    a.update(steps(0.85, 0.45), accepted=2)  # fully accepted: no 0 appended
    assert a.matches == [1, 1, 0, 1, 0, 1, 1]
    fpr, tpr, thr = roc_curve(a.matches, a.probs)
    assert a.tau == pytest.approx(float(thr[np.argmin(fpr + 3 * (1 - tpr))]))
    assert a.tau != 0.4 and a.threshold == a.tau
    a.bind(RunContext())  # a new run starts afresh, at TAU0
    assert (a.tau, a.probs, a.matches) == (0.4, [], [])
    one_label = bound("adaptive:0.4:20")
    for _ in range(4):
        one_label.update(steps(0.9, 0.9), accepted=2)
    assert one_label.tau == 0.4  # eight samples, all accepted: no ROC without both labels


def test_entropy_drops_a_token_whose_bound_is_below_lambda_and_adapts_lambda():
    e = bound("entropy:0.5:20")
    low, high = steps(0.9, 0.3, entropies=[0.1, 2.0])
    assert acceptance_bound(0.1) == pytest.approx(1 - math.sqrt(0.02))
    assert not e.drop(low) and e.drop(high)  # 1 - sqrt(0.2 * 2.0) = 0.37 < 0.5
    assert not e.stop_after(low)
    e.update(steps(0.9, 0.9), accepted=0)  # acceptance rate falls below 0.9: lambda rises
    assert e.lam > 0.5
    before = e.lam
    for _ in range(6):
        e.update(steps(0.9, 0.9), accepted=2)  # rate recovers, whole drafts accepted: lambda falls again
    assert e.lam < before and 0.0 <= e.lam <= 1.0


def test_cumulative_stops_once_a_rejection_is_likely():
    c = bound("cumulative:0.5:20")
    s = steps(0.9, 0.8, 0.6)  # products 0.9, 0.72, 0.432
    assert [c.stop_after(x) for x in s] == [False, False, True]


def test_costaware_compares_the_expected_gain_with_the_marginal_cost():
    free_verify = bound("costaware:20", flat(0.2))  # c = 0.2, verification free
    s = steps(0.9, 0.6, 0.5)  # P*p: 0.81, 0.324, 0.108
    assert [free_verify.stop_after(x) for x in s] == [False, False, True]
    assert free_verify.budget() == 20
    # verification grows: T(1)=100, T(2)=140, T(3)=150 -> marginal cost of draft 1: 0.1 + 0.4, of draft 2: 0.1 + 0.1
    costs = CostModel(target=[(1, 100.0), (2, 140.0), (3, 150.0), (4, 160.0)], assistant=[(1, 10.0), (2, 12.0)])
    growing = bound("costaware:20", costs)
    assert growing.marginal[:3] == pytest.approx([0.5, 0.2, 0.2])
    assert not growing.stop_after(steps(0.5)[0])  # 0.25 > 0.2
    assert growing.stop_after(steps(0.4)[0])      # 0.16 <= 0.2
    never = bound("costaware:20", CostModel(target=[(1, 100.0), (2, 190.0)], assistant=[(1, 20.0)]))
    assert never.budget() == 0  # c + v_1 = 1.1: not even a sure draft pays
    with pytest.raises(StrategyError, match="needs a cost profile"):
        parse_strategy("costaware").bind(RunContext())


def test_disco_scores_the_step_features_with_its_weights(tmp_path):
    w = ClassifierWeights([0] * 5, [1] * 5, [4.0, 0, 0, 0, 0], -2.0, 0.5)  # score = sigmoid(4 p - 2)
    d = parse_strategy("disco:8")
    d.weights = w
    a, b = steps(0.6, 0.4)
    assert step_features(a) == [0.6, 0.5, 0.5, 0.0, pytest.approx(math.log(0.6))]
    assert not d.stop_after(a) and d.stop_after(b)
    assert w.score(step_features(a)) == pytest.approx(1 / (1 + math.exp(-0.4)))
    path = tmp_path / "w.json"
    path.write_text(json.dumps(w.to_dict()))
    assert ClassifierWeights.load(path).to_dict() == w.to_dict()


def test_disco_stops_where_the_predicted_gain_no_longer_pays_the_runs_costs():
    """With a cost profile the stop bar is the next token's marginal cost (c + v_{j+1}, as for costaware), not the
    threshold tuned on another machine; without one, the file's threshold."""
    w = ClassifierWeights([0] * 5, [1] * 5, [4.0, 0, 0, 0, 0], -2.0, 0.9)  # score = sigmoid(4 p - 2)
    a = steps(0.6)[0]  # score 0.599
    gpu = parse_strategy("disco:8")
    gpu.weights = w
    gpu.bind(RunContext(costs=flat(0.05)))  # a cheap draft, free verification: the bar is 0.05
    assert gpu.threshold == pytest.approx(0.05) and not gpu.stop_after(a) and gpu.budget() == 8
    pricey = parse_strategy("disco:8")
    pricey.weights = w
    pricey.bind(RunContext(costs=flat(0.7)))  # each further draft costs 0.7 of a step: 0.599 does not pay it
    assert pricey.stop_after(a)
    cpu = parse_strategy("disco:8")
    cpu.weights = w
    cpu.bind(RunContext(costs=CostModel(target=[(1, 100.0), (2, 190.0)], assistant=[(1, 20.0)])))
    assert cpu.budget() == 0  # c + v_1 = 1.1: not even a sure first draft pays here
    plain = parse_strategy("disco:8")
    plain.weights = w
    plain.bind(RunContext())  # no costs known: the trained threshold (0.9)
    assert plain.threshold == 0.9 and plain.stop_after(a)


def test_pmin_is_llama_cpps_rule_on_hand_made_draft_steps():
    """llama.cpp's p-min reads the probability renormalized over the draft's top-10 mass, drops (does not send) the
    token that fails it, and sends nothing when the draft is shorter than n-min."""
    policy = parse_strategy("pmin:0.5:3:2")
    assert (policy.p, policy.k, policy.n_min) == (0.5, 3, 2) and policy.budget() == 3
    assert not policy.drop(DraftStep.first(0, 7, 0.3, top10=0.5))  # 0.3 / 0.5 = 0.6 >= 0.5: kept (plain prob 0.3)
    assert policy.drop(DraftStep.first(0, 7, 0.3, top10=0.9))  # 0.33 < 0.5: dropped, never verified
    assert policy.keep(steps(0.9)) == 0 and policy.keep(steps(0.9, 0.9)) == 2  # shorter than n-min: not sent
    assert parse_strategy("pmin:0.4").k == 3 and parse_strategy("pmin:0.4").n_min == 0  # llama.cpp's defaults
    assert policy.llama_args() == ["--spec-type", "draft-simple", "--spec-draft-p-min", "0.5", "--spec-draft-n-max",
                                   "3", "--spec-draft-n-min", "2"]
    with pytest.raises(StrategyError):
        parse_strategy("pmin:1.5")


def test_pmin_drops_in_the_core_and_discards_short_drafts(tiny_pair):
    """Through the iteration core: a failing token costs its pass but is not verified; a short draft is not sent."""
    final = run_all(tiny_pair, "def fibonacci(n):", ["autoregressive", "pmin:0.7:6", "pmin:0.0:4:5"],
                    DecodeSettings(max_new_tokens=24))
    base, strict, short = final.decoders
    assert strict.output_ids == base.output_ids == short.output_ids
    assert all(r.draft_calls >= r.lookahead for r in strict.records)
    assert any(r.draft_calls > r.lookahead and r.stop_reason == "confidence" for r in strict.records)
    assert all(r.lookahead == 0 and r.stop_reason == "short" for r in short.records if r.draft_calls)


@pytest.mark.parametrize("content,message", [
    ("{", "cannot read"), ('{"format": 1}', "malformed"), ("[]", "malformed"),
    ('{"format": 1, "features": ["prob"], "mean": [0], "scale": [1], "coef": [1], "intercept": 0, "threshold": 0.5}',
     "features must be"),
    ('{"format": 1, "features": ["prob", "entropy", "margin", "index", "log_cumulative"], "mean": [0, 0, 0, 0, 0], '
     '"scale": [1, 1, 1, 1, 1], "coef": [1, 1, 1, 1, 1], "intercept": 0, "threshold": 2.0}', "threshold must be in"),
])
def test_a_malformed_classifier_is_refused_with_a_clear_error(tmp_path, monkeypatch, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    monkeypatch.setenv("DISCO_CLASSIFIER", str(path))
    with pytest.raises(StrategyError, match=message):
        parse_strategy("disco")
    monkeypatch.setenv("DISCO_CLASSIFIER", str(tmp_path / "missing.json"))
    with pytest.raises(StrategyError, match="python -m disco train"):
        parse_strategy("disco:5")


NEW_SPECS = ["adaptive", "adaptive:0.8:4", "entropy:0.3", "entropy:0.8:5", "cumulative:0.3", "cumulative:0.9:12",
             "costaware", "costaware:3", "disco", "disco:4"]


@pytest.mark.parametrize("prompt,chat", [("def fibonacci(n):", False), ("Explain KV caches.", True),
                                         ("Once upon a time, in a land far away,", True), ("x", False)])
def test_every_new_policy_is_lossless_in_greedy_mode(tiny_pair, prompt, chat):
    ids = encode_prompt(tiny_pair, prompt, chat, 40)
    base = Decoder(tiny_pair, ids, parse_strategy("autoregressive"), DecodeSettings(max_new_tokens=40)).run().output_ids
    for spec in NEW_SPECS:
        d = Decoder(tiny_pair, ids, parse_strategy(spec), DecodeSettings(max_new_tokens=40), costs=flat(0.1)).run()
        assert d.output_ids == base, spec
        assert sum(r.emitted for r in d.records) == len(base) and all(r.lookahead <= r.max_lookahead for r in d.records)


def test_the_race_gives_the_cost_aware_lane_a_cost_profile(tiny_pair):
    final = run_all(tiny_pair, "def fibonacci(n):", ["autoregressive", "costaware:6"], DecodeSettings(max_new_tokens=16))
    assert final.decoders[1].output_ids == final.decoders[0].output_ids
