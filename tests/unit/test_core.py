"""The iteration core on its own (a scripted backend, no models) and its two real backends side by side."""

from __future__ import annotations

import dataclasses
import math

import pytest

from disco.decode.core import Drafted, IterationCore, Verdict
from disco.costs.model import flat
from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.policies import parse_strategy, policy_kinds
from disco.decode.race import greedy_reference
from disco.models import encode_prompt
from disco.replay.run import ReplayRun
from disco.replay.tables import build_table

EOS = 99


class Scripted:
    """A backend whose assistant drafts ``chain`` (token, prob) from every position and whose target's greedy
    continuation is ``truth``; passes cost 10 ms (assistant) and 100 ms (target)."""

    assistant_precision = "model"

    def __init__(self, truth, chain):
        self.truth, self.chain = truth, chain
        self.now = 0.0
        self.fed = {"assistant": [], "target": []}
        self.rollbacks = []

    def clock(self):
        return self.now

    def draft(self, core, index, fed):
        self.fed["assistant"].append(fed)
        self.now += 10
        token, prob = self.chain[min(index, len(self.chain) - 1)]
        return Drafted(token, prob, 0.0, 0.0, 10.0)

    def verify(self, core, fed, steps):
        self.fed["target"].append(fed)
        self.now += 100
        out = core.out_len
        n = 0
        while n < len(steps) and steps[n].token == self.truth[out + n]:
            n += 1
        return Verdict(n, self.truth[out + n], 100.0)

    def rollback(self, t_len, a_len):
        self.rollbacks.append((t_len, a_len))


def test_the_core_accepts_cuts_and_keeps_the_cache_lengths():
    truth = [5, 6, 7, 8, 9, 10, 11, 12]
    backend = Scripted(truth, [(5, 0.9), (6, 0.8), (0, 0.3), (0, 0.2)])
    core = IterationCore(parse_strategy("static:3"), [1, 2, 3], 6, [EOS], backend)
    r = core.step()
    # drafts 5, 6, 0: two accepted, the target's 7 appended; the target was fed the prompt plus the three drafts
    assert (r.lookahead, r.accepted, r.emitted, r.stop_reason) == (3, 2, 3, "max_lookahead")
    assert core.output_ids == [5, 6, 7] and backend.fed["target"] == [6] and backend.fed["assistant"] == [3, 1, 1]
    assert backend.rollbacks[-1] == (len(core.ids) - 1, len(core.ids) - 2)  # target: ids[:-1]; assistant: ids[:-2]
    assert (r.draft_ms, r.verify_ms, r.iteration_ms, r.forward_ms) == (30.0, 100.0, 130.0, 130.0)
    assert r.confidences == [0.9, 0.8, 0.3] and r.min_confidence == 0.3
    r2 = core.step()
    # 3 tokens left: the budget is capped at remaining - 1 = 2, and the output stops at max_new_tokens
    assert r2.max_lookahead == 3 and r2.lookahead == 2 and r2.stop_reason == "length" and r2.accepted == 0
    while not core.done:
        last = core.step()
    assert core.finish_reason == "length" and core.out_len == 6 and last.new_tokens == 6
    assert core.output_ids == truth[:6] and sum(r.emitted for r in core.records) == 6


def test_the_core_stops_at_eos_and_at_the_policys_rule():
    backend = Scripted([5, EOS, 7, 8], [(5, 0.9), (EOS, 0.95), (7, 0.9)])
    core = IterationCore(parse_strategy("static:4"), [1], 10, [EOS], backend)
    r = core.step()
    assert (r.lookahead, r.stop_reason, r.accepted, r.emitted) == (2, "eos", 2, 2)  # EOS drafted, accepted, output ends
    assert core.done and core.finish_reason == "eos" and core.output_ids == [5, EOS]
    rule = IterationCore(parse_strategy("cumulative:0.2:8"), [1], 10, [EOS], Scripted([5, 6, 7, 8, 9], [(5, 0.9), (6, 0.8)]))
    r = rule.step()
    assert (r.lookahead, r.stop_reason) == (2, "confidence")  # 1 - 0.9 * 0.8 = 0.28 > 0.2 after the second draft


def test_a_dropped_draft_is_neither_verified_nor_kept():
    backend = Scripted([5, 6, 7, 8, 9], [(5, 0.9), (6, 0.9)])
    policy = parse_strategy("entropy:0.5:4")
    policy.drop = lambda step: step.index == 1  # judge the second draft's distribution as too flat
    core = IterationCore(policy, [1], 10, [EOS], backend)
    r = core.step()
    assert (r.lookahead, r.draft_calls, r.stop_reason, r.accepted) == (1, 2, "confidence", 1)
    assert backend.fed["target"] == [1 + 1] and core.output_ids == [5, 6]  # 6: the target's own token (a bonus)


SPECS = [cls.canonical for cls in policy_kinds()] + ["adaptive:0.7:4", "entropy:0.6:6", "costaware:5",
                                                     "hybrid:lookup:3+threshold:0.3:5", "hybrid:ngram:1:4+sglang"]


@pytest.mark.parametrize("prompt,chat", [("def fibonacci(n):", False), ("Explain KV caches.", True)])
def test_live_and_replay_backends_give_identical_records(tiny_pair, prompt, chat):
    """Same core, two backends: every record field but the times is equal (confidences to float rounding)."""
    max_new = 28
    ids = encode_prompt(tiny_pair, prompt, chat, max_new)
    table = build_table(tiny_pair, ids, max_new)
    costs = flat(0.2)
    timing = {"draft_ms", "verify_ms", "iteration_ms", "elapsed_ms", "forward_ms", "confidences", "threshold",
              "min_confidence"}
    for spec in SPECS:
        policy = parse_strategy(spec)
        if policy.kind == "oracle":
            policy.reference = greedy_reference(tiny_pair, ids, max_new)
        live = Decoder(tiny_pair, ids, policy, DecodeSettings(max_new_tokens=max_new), costs=costs).run()
        run = ReplayRun(table, parse_strategy(spec), max_new, costs)
        while not run.done:
            run.step()
        assert len(live.records) == len(run.records), spec
        for a, b in zip(live.records, run.records):
            da, db = dataclasses.asdict(a), dataclasses.asdict(b)
            assert {k: v for k, v in da.items() if k not in timing} == {k: v for k, v in db.items() if k not in timing}, spec
            assert da["confidences"] == pytest.approx(db["confidences"], abs=1e-4)
            assert da["min_confidence"] == pytest.approx(db["min_confidence"], abs=1e-4, nan_ok=True)
            assert (math.isnan(a.threshold) and math.isnan(b.threshold)) or a.threshold == pytest.approx(b.threshold, abs=1e-5)
        assert run.result().output_ids == live.output_ids
