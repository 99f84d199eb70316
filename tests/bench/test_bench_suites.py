"""``bench`` on a public benchmark's format (a Spec-Bench question file the test writes): every turn as one chat, whole
kinds held out, too-long prompts skipped and counted, the answer per kind and with each kind held out, timed runs on
later turns; and one line for every bad suite option."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from disco import cli

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now a limerick."]},
    {"question_id": 2, "category": "writing", "turns": ["Describe rain."]},
    {"question_id": 3, "category": "translation", "turns": ["Translate to French: hello.", "And to German?"]},
    {"question_id": 4, "category": "translation", "turns": ["Translate to Spanish: thanks."]},
    {"question_id": 5, "category": "qa", "turns": ["Why is the sky blue?"]},
    {"question_id": 6, "category": "qa", "turns": ["What is " + "very " * 120 + "long?"]},
]


@pytest.fixture(scope="module")
def question_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("specbench") / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


@pytest.fixture(scope="module")
def report(question_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "out"
    code = cli.main(["bench", "--models", "tiny", "--suite", str(question_file), "--turns", "all", "--mode", "both",
                     "--holdout-kinds", "translation", "--holdout", "--max-new-tokens", "8", "--static-ks", "1,2",
                     "--taus", "0.4", "--kmaxes", "4,20", "--timed-prompts", "3", "--no-peer",
                     "--max-prompt-tokens", "200", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def test_every_turn_is_replayed_and_the_too_long_question_is_skipped_and_counted(report):
    runs = pd.read_csv(report / "runs.csv", dtype={"prompt_id": str, "question": str})
    replay = runs[runs["mode"] == "replay"]
    assert set(replay["prompt_id"]) == {"1-t1", "1-t2", "2-t1", "3-t1", "3-t2", "4-t1", "5-t1"}
    assert set(replay[replay["prompt_id"] == "1-t2"]["turn"]) == {2}
    assert set(replay[replay["prompt_id"] == "1-t2"]["question"]) == {"1"}
    assert replay["identical_to_autoregressive"].astype(bool).all()
    prompts = pd.read_csv(report / "prompts.csv", dtype={"prompt_id": str}).set_index("prompt_id")
    assert prompts.loc["6-t1", "status"] == "skipped" and "budget of 200" in prompts.loc["6-t1", "reason"]
    assert (prompts.drop(index="6-t1")["status"] == "used").all()
    # a later turn's prompt holds the earlier turn and the target's answer to it: longer than the turn alone
    assert prompts.loc["1-t2", "prompt_tokens"] > prompts.loc["1-t1", "prompt_tokens"] + len("Now a limerick.")
    meta = json.loads((report / "meta.json").read_text())
    assert meta["prompts_skipped"] == [{"id": "6-t1", "reason": prompts.loc["6-t1", "reason"]}]
    assert meta["holdout_kinds"] == ["translation"] and meta["suite"] == "question.jsonl"


def test_held_out_kinds_are_the_test_split_and_the_timed_runs_are_theirs(report):
    runs = pd.read_csv(report / "runs.csv", dtype={"prompt_id": str})
    splits = runs[runs["mode"] == "replay"].groupby("kind")["split"].unique()
    assert list(splits["translation"]) == ["test"] and list(splits["writing"]) == ["train"]
    timed = runs[runs["mode"] == "timed"]
    assert set(timed["prompt_id"]) == {"3-t1", "3-t2", "4-t1"}  # the later turn runs live too, on its whole chat
    assert timed[timed["implementation"] == "ours"]["identical_to_autoregressive"].astype(bool).all()


def test_the_report_answers_per_kind_and_with_each_kind_held_out(report):
    text = (report / "summary.md").read_text()
    assert "## The seed's question per kind of prompt (replay, cost profile `measured`)" in text
    assert "## Each kind held out (settings chosen on the other kinds, reported on the held one)" in text
    assert "## Prompts and tables" in text and "1 skipped" in text and "`6-t1`" in text
    kinds = pd.read_csv(report / "kinds.csv").set_index("kind")
    assert set(kinds.index) == {"all", "writing", "translation", "qa"}
    assert kinds.loc["writing", "prompts"] == 3 and kinds.loc["all", "prompts"] == 7
    for kind, row in kinds.iterrows():  # every share is the ratio of the figures beside it
        assert row["reference_of_best_threshold"] == pytest.approx(row["reference"] / row["best_threshold_speedup"])
        assert row["dynamic_over_static"] == pytest.approx(row["best_dynamic_speedup"] / row["best_static_speedup"])
    held = pd.read_csv(report / "kinds_holdout.csv")
    assert set(held["held_kind"]) == {"writing", "translation", "qa"}
    runs = pd.read_csv(report / "runs.csv", dtype={"prompt_id": str})
    replay = runs[runs["mode"] == "replay"]
    for r in held[held["family"] == "static"].itertuples():  # the setting chosen on the others, re-derived by hand
        others = replay[(replay["kind"] != r.held_kind) & replay["strategy"].str.startswith("static:")]
        geo = others.groupby("strategy")["speedup"].apply(lambda s: float(s.prod() ** (1 / len(s))))
        assert r.chosen_on_others == geo.idxmax()


@pytest.mark.parametrize("args, needle", [
    (["--suite", "hf:nope"], "write hf:DATASET:SPLIT"),
    (["--holdout-kinds", "poetry"], "no prompt of kind 'poetry'"),
    (["--limit", "0"], "expected a positive integer"),
    (["--long-prompts", "truncate"], "invalid choice"),
    (["--max-prompt-tokens", "2"], "at least 16"),
    (["--turns", "some"], "invalid choice"),
    (["--ray", "local", "--ray-threads", "0"], "at least 1"),
    (["--ray", "local", "--ray-runtime-env", "[1]"], "JSON object"),
    (["--ray", "local", "--mode", "timed"], "--mode replay or both"),
])
def test_bad_suite_options_are_one_line(question_file, capsys, args, needle, tmp_path):
    code = cli.main(["bench", "--models", "tiny", "--suite", str(question_file), "--out", str(tmp_path / "o"),
                     "--no-progress", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and "\n" not in err, err
