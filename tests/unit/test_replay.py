"""Replay against the real engine on the tiny pair: for every policy kind, the predicted iterations
(lookahead, accepted, emitted, stop reason, K in force), target and assistant passes and the output
must equal what ``Decoder`` actually does, exactly."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.policies import parse_strategy
from disco.decode.race import greedy_reference
from disco.models import encode_prompt
from disco.costs.model import CostModel
from disco.policies.grids import default_grid
from disco.replay.run import replay, replay_many
from disco.replay.tables import ReplayError, ReplayTable, build_table


def P(specs):
    """Policies from specs: the edge's one parse, here in the test."""
    return [parse_strategy(s) for s in specs]

SPECS = [
    "autoregressive", "static:1", "static:2", "static:4", "static:7", "static:20",
    "heuristic:1", "heuristic:3", "heuristic:5",
    "threshold:0:4", "threshold:0.1:20", "threshold:0.3:5", "threshold:0.4:20", "threshold:0.5:10",
    "threshold:0.7:15", "threshold:0.9:3", "threshold:1.0:6", "threshold:0.6:1",
    "oracle", "oracle:3", "oracle:1",
    "adaptive", "adaptive:0.7:5", "adaptive:0.2:3", "entropy:0.5", "entropy:0.2:6", "entropy:0.9:20",
    "cumulative:0.5", "cumulative:0.2:8", "cumulative:0.9:3", "costaware", "costaware:4", "disco", "disco:5",
    "ngram:1:4", "ngram:2:8", "hybrid:lookup:4+static:3", "hybrid:ngram:1:4+threshold:0.3:6",
    "hybrid:copy:8:1+pmin:0.3:4:2", "hybrid:suffix:1:0.1:6+heuristic:3",
]
# every run, live or replayed, gets this cost model (the cost-aware policy reads it; verification grows with k)
COSTS = CostModel(target=[(1, 100.0), (2, 104.0), (4, 112.0), (40, 300.0)], assistant=[(1, 8.0), (40, 30.0)])
PROMPTS = [
    ("def fibonacci(n):", False), ("The quick brown fox", False), ("Explain KV caches.", True), ("x", False),
    ("import numpy as np\n", False), ("Once upon a time, in a land far away,", True),
    ("SELECT * FROM users WHERE", False), ("{'a': 1, 'b': [2, 3]}", True),
]
FIELDS = ("iteration", "lookahead", "accepted", "emitted", "stop_reason", "draft_calls", "target_tokens",
          "max_lookahead", "new_tokens")


def _real(pair, ids, spec, max_new):
    policy = parse_strategy(spec)
    if policy.kind == "oracle":
        policy.reference = greedy_reference(pair, ids, max_new)
    return Decoder(pair, ids, policy, DecodeSettings(max_new_tokens=max_new), costs=COSTS).run()


def _assert_same(decoder, result, spec):
    real = [tuple(getattr(r, f) for f in FIELDS) for r in decoder.records]
    predicted = [tuple(getattr(r, f) for f in FIELDS) for r in result.records]
    assert predicted == real, spec
    assert result.output_ids == decoder.output_ids, spec
    for r, p in zip(decoder.records, result.records):
        assert len(p.confidences) == len(r.confidences)
        for a, b in zip(p.confidences, r.confidences):
            assert a == pytest.approx(b, abs=1e-4), spec
        # adaptive's threshold is one of the drafted probabilities, which replay's chains compute to ~1e-7
        assert (math.isnan(p.threshold) and math.isnan(r.threshold)) or p.threshold == pytest.approx(r.threshold, abs=1e-5)
    assert sum(r.draft_calls for r in result.records) == sum(r.draft_calls for r in decoder.records)


@pytest.mark.parametrize("prompt,chat", PROMPTS)
@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_replay_matches_the_engine_for_every_policy(tiny_pair, prompt, chat):
    max_new = 32
    ids = encode_prompt(tiny_pair, prompt, chat, max_new)
    table = build_table(tiny_pair, ids, max_new)
    results = replay_many(table, P(SPECS), max_new, COSTS)
    for spec in SPECS:
        _assert_same(_real(tiny_pair, ids, spec, max_new), results[spec], spec)


@pytest.mark.parametrize("max_new", [1, 2, 3, 9])
def test_length_caps_match_and_a_long_table_serves_shorter_runs(tiny_pair, max_new):
    ids = encode_prompt(tiny_pair, "Once upon a time", False, 24)
    table = build_table(tiny_pair, ids, 24)  # built for 24 tokens, replayed for fewer
    results = replay_many(table, P(SPECS), max_new, COSTS)
    for spec in SPECS:
        decoder = _real(tiny_pair, ids, spec, max_new)
        _assert_same(decoder, results[spec], spec)
        if max_new == 1 and decoder.policy.uses_assistant:
            assert results[spec].records[0].stop_reason == "length"


def test_eos_drafted_and_emitted_matches(tiny_pair):
    probe = build_table(tiny_pair, encode_prompt(tiny_pair, "def fibonacci(n):", False, 40), 40)
    first_draft, _ = probe.draft(0, 0)
    pair = dataclasses.replace(tiny_pair, eos_ids=(first_draft,))  # the assistant's first draft plays EOS
    stops = set()
    for prompt in ("def fibonacci(n):", "The quick brown fox", "x"):
        ids = encode_prompt(pair, prompt, False, 40)
        table = build_table(pair, ids, 40)
        results = replay_many(table, P(SPECS), 40, COSTS)
        for spec in SPECS:
            decoder = _real(pair, ids, spec, 40)
            _assert_same(decoder, results[spec], spec)
            stops |= {r.stop_reason for r in decoder.records}
    assert "eos" in stops  # the assistant drafted the EOS token at least once


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_default_grid_replays_like_the_engine(tiny_pair):
    grid = default_grid()
    classic = 1 + 11 + 1 + 19 * 4 + 1
    assert grid[0].spec == "autoregressive" and len(default_grid(kinds=())) == classic
    assert {p.kind for p in grid[classic:]} == {"adaptive", "entropy", "cumulative", "costaware", "disco", "pmin", "lookup", "copy",
                                              "ngram", "suffix", "sglang", "bandit", "hybrid"}
    ids = encode_prompt(tiny_pair, "Explain KV caches.", True, 24)
    table = build_table(tiny_pair, ids, 24)
    results = replay_many(table, grid, 24, COSTS)
    online = [p.spec for p in grid if p.kind in ("sglang", "bandit", "suffix", "ngram")]  # the rules added last
    online += [p.spec for p in grid if p.kind == "hybrid"][::5]
    for spec in [p.spec for p in grid[::7]] + ["threshold:0.4:20", "oracle:20", "heuristic:5", "static:20"] + online:
        _assert_same(_real(tiny_pair, ids, spec, 24), results[spec], spec)


def test_chains_are_shared_between_positions(tiny_pair):
    passes = stored = 0
    for prompt in ("def fibonacci(n):", "The quick brown fox", "import numpy as np\n"):
        ids = encode_prompt(tiny_pair, prompt, False, 40)
        table = build_table(tiny_pair, ids, 40)
        # static:1 and static:3 start inside the stretches where static:8's drafts were accepted
        replay_many(table, P(["static:8", "static:3", "static:1", "threshold:0.2:8"]), 40)
        passes += table.builder.passes
        stored += sum(len(c.tokens) for c in table.chains.values())
        hits, total = table.first_token_agreement(40)
        assert 0 < hits <= total == min(39, len(table.reference))
    # every chain token stored costs at most one assistant pass, and derived suffixes cost nothing
    assert passes < 0.8 * stored


def test_table_round_trips_through_disk_and_replays_without_models(tiny_pair, tmp_path):
    ids = encode_prompt(tiny_pair, "The quick brown fox", False, 24)
    table = build_table(tiny_pair, ids, 24, cache_dir=tmp_path, name="fox")
    before = replay_many(table, P(["static:3", "threshold:0.4:20", "oracle"]), 24)
    table.save()
    files = list(tmp_path.glob("fox-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["reference"] == table.reference
    loaded = ReplayTable.from_dict(json.loads(files[0].read_text()))  # no models attached
    after = replay_many(loaded, P(["static:3", "threshold:0.4:20", "oracle"]), 24)
    for spec, res in before.items():
        assert [r.lookahead for r in after[spec].records] == [r.lookahead for r in res.records]
        assert after[spec].output_ids == res.output_ids
    with pytest.raises(ReplayError):
        replay(loaded, parse_strategy("static:40"), 24)  # deeper chains than the table holds, and no models to extend it
    again = build_table(tiny_pair, ids, 24, cache_dir=tmp_path, name="fox")  # resumes from the cache
    assert again.reference == table.reference and len(again.chains) == len(table.chains)


def test_time_estimate_follows_the_cost_model(tiny_pair):
    ids = encode_prompt(tiny_pair, "Once upon a time", False, 12)
    table = build_table(tiny_pair, ids, 12)
    costs = CostModel(target=[(1, 10.0), (2, 12.0), (len(ids), 50.0), (len(ids) + 30, 80.0)],
                      assistant=[(1, 2.0), (2, 3.0), (len(ids) + 30, 20.0)])
    ar = replay(table, parse_strategy("autoregressive"), 12, costs)
    assert ar.summary()["seconds"] * 1000 == pytest.approx(costs.target_ms(len(ids)) + 11 * 10.0)
    spec = replay(table, parse_strategy("static:3"), 12, costs)
    expected = 0.0
    for r in spec.records:
        expected += costs.target_ms(r.target_tokens)
        assert r.verify_ms == pytest.approx(costs.target_ms(r.target_tokens))
        assert r.iteration_ms == pytest.approx(r.draft_ms + r.verify_ms)
    assert spec.records[0].draft_ms >= costs.assistant_ms(len(ids))  # iteration 1 prefills the assistant
    assert costs.target_ms(1.5) == pytest.approx(11.0)  # piecewise-linear between measured sizes
    assert costs.cost_ratio == pytest.approx(0.2)
    assert CostModel.from_dict(costs.to_dict()).target == costs.target
