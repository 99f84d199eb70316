"""Train/test selection: each kind's setting is chosen on train prompts only, reported on test prompts."""

from __future__ import annotations

import pandas as pd
import pytest

from disco.bench.holdout import best_new, holdout_frame, holdout_md
from disco.suites import Selection, pick, split_of, split_prompts


def _runs(speedups: dict) -> pd.DataFrame:
    rows = []
    for (strategy, split), values in speedups.items():
        for i, v in enumerate(values):
            rows.append({"mode": "replay", "strategy": strategy, "split": split, "prompt_id": f"{split}{i}", "speedup": v})
    return pd.DataFrame(rows)


def test_each_kind_is_chosen_on_train_and_reported_on_test():
    runs = _runs({
        ("autoregressive", "train"): [1, 1], ("autoregressive", "test"): [1, 1],
        ("static:2", "train"): [2, 2], ("static:2", "test"): [1.5, 1.5],
        ("static:4", "train"): [1.8, 1.8], ("static:4", "test"): [3, 3],  # better on test, but never chosen
        ("threshold:0.4:20", "train"): [2.1, 2.1], ("threshold:0.4:20", "test"): [2, 2],
        ("threshold:0.6:10", "train"): [2.2, 2.2], ("threshold:0.6:10", "test"): [1.6, 1.6],
        ("oracle:20", "train"): [4, 4], ("oracle:20", "test"): [4, 4],
        ("cumulative:0.5:20", "train"): [2.5, 2.5], ("cumulative:0.5:20", "test"): [3.9, 3.9],
        ("entropy:0.3:20", "train"): [2.4, 2.4], ("entropy:0.3:20", "test"): [4.0, 4.0],
    })
    frame = holdout_frame(runs).set_index("kind")
    assert frame.loc["static", "setting"] == "static:2" and frame.loc["static", "test_speedup"] == pytest.approx(1.5)
    assert frame.loc["threshold", "setting"] == "threshold:0.6:10"
    assert frame.loc["cumulative", "vs_best_static"] == pytest.approx(3.9 / 1.5)
    assert frame.loc["cumulative", "of_oracle"] == pytest.approx(3.9 / 4)
    assert "threshold:0.4:20 (fixed)" in frame.index
    best = best_new(holdout_frame(runs))
    assert best["kind"] == "cumulative"  # best on train, although entropy is better on test
    md = holdout_md(holdout_frame(runs))
    assert "≥ best static K + 10 %: met" in md and "≥ 95 % of the oracle: met" in md


def test_only_rules_that_speculate_earn_a_verdict_and_none_while_slower_than_the_target_alone():
    """The report's goal lines: prompt lookup and a rule that drafts nothing are not "new stopping rules", and a rule
    slower than the target alone meets no goal, whatever its share of the oracle (issue 25: copy:5:3 at 0.998x)."""
    runs = _runs({
        ("autoregressive", "train"): [1, 1], ("autoregressive", "test"): [1, 1],
        ("static:1", "train"): [0.95, 0.95], ("static:1", "test"): [0.95, 0.95],
        ("threshold:0.9:5", "train"): [0.96, 0.96], ("threshold:0.9:5", "test"): [0.96, 0.96],
        ("oracle:20", "train"): [1.03, 1.03], ("oracle:20", "test"): [1.04, 1.04],
        ("copy:5:3", "train"): [1.2, 1.2], ("copy:5:3", "test"): [0.998, 0.998],       # a drafter without a model
        ("costaware:20", "train"): [1.1, 1.1], ("costaware:20", "test"): [1.0, 1.0],   # drafts nothing here
        ("cumulative:0.2:5", "train"): [0.99, 0.99], ("cumulative:0.2:5", "test"): [0.99, 0.99],
    })
    runs["drafted"] = [0 if s in ("autoregressive", "costaware:20") else 5 for s in runs["strategy"]]
    best = best_new(holdout_frame(runs))
    assert best["kind"] == "cumulative"
    md = holdout_md(holdout_frame(runs))
    assert "**cumulative** (`cumulative:0.2:5`)" in md and "≥ 95 % of the oracle: not met" in md
    assert ": met" not in md and "slower than the target alone" in md
    runs = runs[runs["strategy"] != "cumulative:0.2:5"]
    assert best_new(holdout_frame(runs)) is None and "Best new rule" not in holdout_md(holdout_frame(runs))


def test_no_table_without_both_splits():
    runs = _runs({("autoregressive", "train"): [1], ("static:2", "train"): [2]})
    assert holdout_frame(runs).empty and holdout_md(holdout_frame(runs)) == ""


def test_the_suite_splits_by_prompt_alternately_within_each_kind():
    suite = pick(Selection()).prompts
    which = split_of(suite)
    assert {p.split for p in suite} == {"train", "test"} and all(which[p.id] == p.split for p in suite)
    for kind in {p.kind for p in suite}:
        ids = [p.id for p in suite if p.kind == kind]
        assert [which[i] for i in ids[:2]] == ["train", "test"]
    train, test = split_prompts(suite, "train"), split_prompts(suite, "test")
    assert len(train) + len(test) == len(suite) and not {p.id for p in train} & {p.id for p in test}
