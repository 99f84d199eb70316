"""Hybrid drafting (``hybrid:CONTEXT+ASSISTANT``) and llama.cpp's ngram-simple drafter (``ngram:N:M``): the grammar,
llama.cpp's match as its source writes it, both drafters used in one run with the output the target's own, live =
replay, and each part hearing only of its own drafts. Sampling: tests/unit/test_sampling.py."""

from __future__ import annotations

import dataclasses
import math

import pytest

from disco.costs.model import flat
from disco.decode.live import Decoder
from disco.decode.race import greedy_reference
from disco.decode.settings import DecodeSettings
from disco.models import encode_prompt
from disco.policies import DraftStep, RunContext, StrategyError, parse_strategy
from disco.policies.export import take_away
from disco.policies.lookup import latest_match
from disco.replay.run import ReplayRun
from disco.replay.tables import build_table

REPEATING = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):"


def test_latest_match_is_llama_cpps_ngram_simple():
    # the last 3 tokens (1 2 3) occurred at 1 and at 5: llama.cpp takes the latest, and copies what followed it
    ids = [0, 1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 5, 5, 5, 5, 1, 2, 3]
    assert latest_match(ids, 3, 4) == [7, 8, 5, 5]          # the latest earlier occurrence, not the earliest (9)
    assert latest_match(ids, 3, 2) == []                    # fewer than n tokens may follow: nothing
    assert latest_match(ids, 2, 3) == [7, 8, 5]
    assert latest_match([1, 2, 3, 1, 2], 2, 8) == []         # history too short for n + m + 1
    assert latest_match([7, 1, 2, 5, 5, 5, 5, 5, 5, 9, 1, 2], 2, 3) == [5, 5, 5]
    assert latest_match([1, 2, 5, 5, 5, 5, 5, 5, 9, 1, 2], 2, 3) == []  # position 0 never counts


def test_the_grammar_and_its_one_line_errors():
    p = parse_strategy("hybrid:ngram:3:16+pmin:0.4:3@q4_0")
    assert p.kind == "hybrid" and p.assistant_precision == "q4_0" and p.spec.endswith("@q4_0")
    assert p.from_context.kind == "ngram" and p.from_assistant.kind == "pmin" and p.k == 16
    assert parse_strategy(p.spec).spec == p.spec
    for bad, message in [("hybrid:copy:16", "CONTEXT\\+ASSISTANT"), ("hybrid:static:2+static:3", "without a model"),
                         ("hybrid:copy:16+lookup:2", "assistant's rule"), ("hybrid:copy:16+oracle", "not the oracle"),
                         ("hybrid:copy:x+static:2", "context part"), ("hybrid:copy:4+static:2@int8+static:3", "goes at the end of the spec"),
                         ("hybrid:copy:4@int8+static:2", "goes at the end of the spec"),
                         ("ngram:0", "N must be between")]:
        with pytest.raises(StrategyError, match=message):
            parse_strategy(bad)


def _iterations(policy_spec, pair, ids, max_new, costs=None):
    decoder = Decoder(pair, ids, parse_strategy(policy_spec), DecodeSettings(max_new_tokens=max_new), costs=costs)
    return decoder.run()


@pytest.mark.parametrize("spec", ["hybrid:lookup:4+static:3", "hybrid:ngram:2:6+threshold:0.3:6",
                                  "hybrid:copy:8:1+sglang", "hybrid:suffix:1:0.1:6+bandit:6"])
def test_both_drafters_in_one_run_greedy_identical_and_replayed_exactly(tiny_pair, spec):
    max_new = 40
    ids = encode_prompt(tiny_pair, REPEATING, False, max_new)
    reference = greedy_reference(tiny_pair, ids, max_new)
    costs = flat(0.2)
    live = _iterations(spec, tiny_pair, ids, max_new, costs)
    assert live.output_ids == reference
    drafters = [r.drafter for r in live.records]
    assert "lookup" in drafters and "assistant" in drafters, drafters  # the prompt repeats itself, the output not all
    for r in live.records:
        assert (r.draft_calls > 0) == (r.drafter == "assistant" and r.lookahead > 0) or r.lookahead == 0
        assert r.assistant_precision == ("none" if r.drafter == "lookup" else tiny_pair.assistant_precision)
        if r.drafter == "lookup" and spec.split("+")[1].startswith("threshold"):
            assert math.isnan(r.threshold)  # the assistant's τ played no part in a copied draft
    run = ReplayRun(build_table(tiny_pair, ids, max_new), parse_strategy(spec), max_new, costs)
    while not run.done:
        run.step()
    timing = {"draft_ms", "verify_ms", "iteration_ms", "elapsed_ms", "forward_ms", "confidences", "threshold",
              "min_confidence"}
    strip = lambda r: {k: v for k, v in dataclasses.asdict(r).items() if k not in timing}  # noqa: E731
    assert [strip(r) for r in run.records] == [strip(r) for r in live.records]


def test_each_part_hears_only_of_its_own_drafts():
    p = parse_strategy("hybrid:lookup:3+sglang")
    p.bind(RunContext())
    heard = []
    p.from_assistant.update = lambda steps, accepted: heard.append(("assistant", len(steps), accepted))
    p.from_context.update = lambda steps, accepted: heard.append(("context", len(steps), accepted))
    step = DraftStep.first(0, 5, 1.0)
    assert p.propose([1, 2, 1], 3, set()) == [2, 1]  # "1" matched: its continuation
    p.update([step, step.then(1, 1.0)], 1)
    assert p.propose([1, 2, 3], 3, set()) == []      # no match: the assistant drafts this iteration
    p.update([step], 0)
    assert heard == [("context", 2, 1), ("assistant", 1, 0)]
    assert p.budget() == p.from_assistant.budget() and p.propose_budget() == 3


def test_the_bandit_part_needs_the_cost_profile():
    with pytest.raises(StrategyError, match="needs a cost profile"):
        parse_strategy("hybrid:copy:16+bandit").bind(RunContext())


def test_llama_cpps_comma_list_is_the_exact_take_away():
    out = take_away(parse_strategy("hybrid:ngram:3:16+pmin:0.4:3:1"))
    llama = out["llama.cpp"]
    assert llama["exact"] and llama["config"][:2] == ["--spec-type", "ngram-simple,draft-simple"]
    assert "--spec-ngram-simple-size-n 3" in llama["text"] and "--spec-draft-n-min 1" in llama["text"]
    assert "--spec-draft-model" in llama["text"]
    other = take_away(parse_strategy("hybrid:copy:16:3+threshold:0.4:20"))
    assert not other["llama.cpp"]["exact"] and other["llama.cpp"]["note"]
    assert other["transformers"]["config"] is not None and not other["transformers"]["exact"]
    assert other["vllm"]["note"]
