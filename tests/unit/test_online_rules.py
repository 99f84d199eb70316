"""The rules that tune themselves during a run: SGLang's adaptive depth and the online bandit over settings. Their
update rules on hand-made verification outcomes (greedy identity, live = replay and sampling are covered for every
kind by test_core, test_replay and test_sampling, which take each kind's canonical spec from the registry)."""

from __future__ import annotations

import pytest

from disco.costs.model import CostModel
from disco.policies import DraftStep, RunContext, StrategyError, parse_strategy
from disco.policies import bandit as bandit_mod
from disco.policies import sglang

FLAT = CostModel([(1, 10.0), (64, 10.0)], [(1, 1.0), (64, 1.0)])  # verification free, an assistant step 0.1


def _steps(n: int, prob: float = 0.9) -> list[DraftStep]:
    step = DraftStep.first(0, 1, prob)
    out = [step]
    for _ in range(n - 1):
        step = step.then(1, prob)
        out.append(step)
    return out


def _verify(policy, accepted_of) -> list[int]:
    """Run iterations with ``accepted_of(depth)`` drafts accepted; the budget of each iteration, in order."""
    budgets = []
    for _ in range(40):
        k = policy.budget()
        budgets.append(k)
        policy.update(_steps(k), accepted_of(k))
    return budgets


def test_sglang_starts_at_its_init_and_holds_through_the_warm_up():
    p = parse_strategy("sglang")
    assert p.budget() == 3 and p.average == 2.0  # SGLang's --speculative-num-steps 3, the average at INIT - 1
    assert parse_strategy("sglang:4").budget() == 5  # not a candidate: the middle one
    budgets = _verify(p, lambda k: k)  # every draft accepted
    assert budgets[:15] == [3] * 15  # 10 warm-up verifications, then reconsidered at the 15th (every 5th)
    # the average (3 - 0.8^15 = 2.96 > 3 - 0.5) calls for 5; at the 25th it is 4.78 > 4.5: 7, the top
    assert budgets[15:25] == [5] * 10 and set(budgets[25:]) == {7}


def test_sglang_steps_down_with_hysteresis_when_drafts_are_rejected():
    p = parse_strategy("sglang:7")
    budgets = _verify(p, lambda k: 0)
    assert budgets[0] == 7 and budgets[-1] == 1  # nothing accepted: down to the smallest candidate
    first_change = next(i for i, b in enumerate(budgets) if b != 7)
    assert first_change == 15  # only at a reconsideration (after 10 warm-up, every 5th)
    # an average just above the lower candidate's bar (s - 0.5 - 0.25) keeps the depth
    q = parse_strategy("sglang:3")
    q.average = 1 - 0.5 - 0.25 + 0.01
    assert q._reconsidered() == 3
    q.average = 1 - 0.5 - 0.25
    assert q._reconsidered() == 1
    q.average = 3 - 0.5 + 0.01  # over the current depth's bar: up one
    assert q._reconsidered() == 5


def test_sglang_learns_nothing_from_an_iteration_that_drafted_nothing():
    p = parse_strategy("sglang")
    p.update([], 0)
    assert p.verified == 0 and p.average == 2.0


def test_the_bandit_plays_every_arm_once_then_the_best_by_ucb():
    p = parse_strategy("bandit:20")
    p.bind(RunContext(costs=FLAT))
    arms = list(p.arms)
    assert arms == [(1, 0.0), (2, 0.0), (4, 0.0), (8, 0.0), (20, 0.2), (20, 0.4), (20, 0.6), (20, 0.8)]
    seen = []
    for _ in arms:
        k = p.budget()
        seen.append(p.arms[p.arm])
        p.update(_steps(k), k if k == 8 else 0)  # only static 8 has its drafts accepted
    assert seen == arms
    later = []
    for _ in range(30):
        k = p.budget()
        later.append(p.arms[p.arm])
        p.update(_steps(k), k if k == 8 else 0)
    assert later.count((8, 0.0)) > 20  # it settles on the arm that pays


def test_the_bandit_reward_is_tokens_per_unit_of_cost():
    p = parse_strategy("bandit:20")
    p.bind(RunContext(costs=FLAT))
    assert p.reward(4, 4) == pytest.approx(5 / (1 + 4 * 0.1))
    costly = CostModel([(1, 10.0), (2, 20.0), (5, 50.0)], [(1, 5.0)])  # each verified token a whole step
    p.bind(RunContext(costs=costly))
    assert p.reward(1, 0) == pytest.approx(1 / (2 + 0.5)) and p.reward(0, 0) == pytest.approx(1.0)


def test_the_bandit_arms_respect_kmax_and_its_threshold_stops_drafts():
    p = parse_strategy("bandit:3")
    assert p.arms[:3] == [(1, 0.0), (2, 0.0), (3, 0.0)] and max(k for k, _ in p.arms) == 3
    p.bind(RunContext(costs=FLAT))
    p.arm = p.arms.index((3, 0.6))
    assert p.stop_after(DraftStep.first(0, 1, 0.5)) and not p.stop_after(DraftStep.first(0, 1, 0.7))
    assert p.threshold == 0.6
    p.arm = 0
    assert p.threshold is None and not p.stop_after(DraftStep.first(0, 1, 0.01))


def test_the_bandit_needs_a_cost_profile():
    with pytest.raises(StrategyError, match="needs a cost profile"):
        parse_strategy("bandit").bind(RunContext())
    assert bandit_mod.Bandit.needs_costs and not sglang.SGLangAdaptive.needs_costs


def test_the_regret_report_sets_the_bandit_against_its_own_arms_in_hindsight():
    import pandas as pd

    from disco.bench.online import arm_specs, regret_frame, regret_md

    arms = arm_specs("bandit:4")
    assert arms == ["static:1", "static:2", "static:4", "threshold:0.2:4", "threshold:0.4:4", "threshold:0.6:4",
                    "threshold:0.8:4"]
    speed = {"p1": {"static:2": 2.0, "static:4": 1.5}, "p2": {"static:2": 1.0, "static:4": 1.6}}
    rows = []
    for prompt, kind in (("p1", "code"), ("p2", "prose")):
        for spec in arms + ["bandit:4", "autoregressive"]:
            value = 1.8 if spec == "bandit:4" else speed[prompt].get(spec, 0.9)
            rows.append({"prompt_id": prompt, "kind": kind, "strategy": spec, "mode": "replay",
                         "implementation": "ours", "speedup": value})
    frame = regret_frame(pd.DataFrame(rows)).set_index("prompt_id")
    assert frame.loc["p1", "best_arm"] == "static:2" and frame.loc["p2", "best_arm"] == "static:4"
    assert frame.loc["p1", "regret_vs_prompt_best"] == pytest.approx(0.1)
    assert frame.loc["p2", "regret_vs_prompt_best"] == pytest.approx(1 - 1.8 / 1.6)  # negative: it beat every arm
    # the single best arm over both prompts: static:4 (geomean 1.55) over static:2 (1.41)
    assert set(frame["overall_arm"]) == {"static:4"}
    assert "`bandit:4` | 2 | 1.80x | `static:4` | 1.55x" in regret_md(frame.reset_index())
    assert regret_frame(pd.DataFrame(rows).query("strategy != 'bandit:4'")).empty


def test_suffix_matches_the_longest_earlier_suffix_and_follows_its_most_frequent_continuation():
    from disco.policies.suffix import TREE_DEPTH, follow, matches

    ids = [1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3]
    assert matches(ids) == (3, [3, 8])  # "1 2 3" twice before, each with a continuation
    assert follow(ids, [3, 8], 5, 0.1, set()) == [4, 9, 1, 2, 3]  # a tie: the continuation seen first
    assert follow(ids, [3, 8], 5, 0.6, set()) == []  # each continuation is 1 of 2 occurrences: 0.5 < 0.6
    assert follow(ids, [3, 8], 5, 0.1, {9}) == [4]  # stops before an end-of-sequence token
    assert matches([7, 8]) == (0, []) and matches([5]) == (0, [])
    assert matches([4] * 40)[0] == TREE_DEPTH  # the match is capped at the tree depth


def test_suffix_length_rule_is_factor_times_the_match_within_the_tree_depth():
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]  # "1 2 3" matched (3 tokens), then 4 5 6 7 8 follow it
    assert parse_strategy("suffix").propose(ids, 24, set()) == [4, 5, 6]  # FACTOR 1: 3 tokens
    assert parse_strategy("suffix:2").propose(ids, 24, set()) == [4, 5, 6, 7, 8, 1]  # 6 tokens
    assert parse_strategy("suffix:2:0.1:4").propose(ids, 24, set()) == [4, 5, 6, 7]  # KMAX
    assert parse_strategy("suffix:2").propose(ids, 2, set()) == [4, 5]  # the iteration's budget
    assert parse_strategy("suffix:0.5").propose(ids, 24, set()) == [4]  # int(0.5 x 3)
    assert parse_strategy("suffix").propose([1, 2, 3], 24, set()) == []  # no earlier match: no draft
    long = list(range(30)) + list(range(20))  # a 20-token match leaves the tree depth 4 tokens of draft
    assert parse_strategy("suffix:2").propose(long, 24, set()) == [20, 21, 22, 23]


def test_model_free_drafters_are_not_counted_as_stopping_rules():
    """The per-kind answer's "best dynamic rule" and the report's "new stopping rule" verdicts leave out every drafter
    without a model (lookup, copy, suffix): what they copy, not a rule on the assistant's draft, sets their length."""
    from disco.bench import holdout, kinds

    model_free = {"lookup", "copy", "suffix", "ngram"}
    assert model_free | {"hybrid"} <= kinds.NOT_DYNAMIC and set(holdout.LOOKUP_KINDS) == model_free
    assert kinds.FAMILIES["dynamic"]("bandit") and kinds.FAMILIES["dynamic"]("sglang")
    assert not kinds.FAMILIES["dynamic"]("suffix")
