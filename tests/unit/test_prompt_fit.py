"""A suite prompt's token ids (``disco.tables.encoding``, through the table phase ``disco.tables.phase``): later turns
of a chat follow the target's own greedy answers, whose tables the phase builds first (the encoder never builds one),
and the length rule skips or cuts (in the middle) what does not fit, counting both; a cached table is matched to the
prompt it was built from."""

from __future__ import annotations

import pytest

from disco.errors import BenchError
from disco.replay.tables import build_table
from disco.suites import SuitePrompt
from disco.tables.encoding import PromptEncoder, TurnUnanswered
from disco.tables.fitting import Fitting, PromptSkipped
from disco.tables.identity import PairSpec, table_matches
from disco.tables.phase import Here, TablePhase

MAX_NEW = 6


def test_a_later_turn_follows_the_targets_greedy_answer_to_the_earlier_one(tiny_pair, tmp_path):
    first = SuitePrompt("q-t1", "writing", True, "write a poem", group="q")
    second = SuitePrompt("q-t2", "writing", True, "shorter please", history=("write a poem",), group="q")
    with pytest.raises(TurnUnanswered):  # the encoder alone builds no table: turn 1 has not been answered
        PromptEncoder(tiny_pair, MAX_NEW).ids(second)
    assert not list(tmp_path.glob("*.json"))
    phase = TablePhase.here(tiny_pair, MAX_NEW, tmp_path)
    encoder = phase.encoder
    ids = phase.ids(second)  # the phase builds turn 1's table first, then encodes turn 2
    answer = build_table(tiny_pair, tiny_pair.encode("write a poem", True), MAX_NEW, None).reference_for(MAX_NEW)
    expected = tiny_pair.encode_chat([{"role": "user", "content": "write a poem"},
                                      {"role": "assistant", "content": tiny_pair.decode(answer)},
                                      {"role": "user", "content": "shorter please"}])
    assert ids == expected
    # the earlier turn's table is in the cache under its own id, the one its own prompt replays
    assert len(list(tmp_path.glob("q-t1-*.json"))) == 1
    assert encoder.ids(first) == tiny_pair.encode("write a poem", True)
    about = encoder.about(second)
    assert about["answers"] == MAX_NEW and about["sha"] == second.fingerprint and about["cut"] == 0


def test_a_prompt_over_the_budget_is_skipped_by_default_and_counted(tiny_pair):
    long = SuitePrompt("long", "k", False, "abcdefghij" * 10)
    short = SuitePrompt("short", "k", False, "abc")
    encoder = PromptEncoder(tiny_pair, MAX_NEW, Fitting(max_prompt_tokens=50))
    assert encoder.ids(short) == tiny_pair.encode("abc", False)
    with pytest.raises(PromptSkipped, match="over|exceed"):
        encoder.ids(long)
    assert "budget of 50" in encoder.skipped["long"]
    with pytest.raises(PromptSkipped):  # asked again: the same answer, not a second encoding
        encoder.ids(long)


def test_the_context_bounds_the_prompt_with_its_new_tokens(tiny_pair):
    text = "x" * (tiny_pair.context_length - 3)
    encoder = PromptEncoder(tiny_pair, MAX_NEW)
    with pytest.raises(PromptSkipped):
        encoder.ids(SuitePrompt("big", "k", False, text))
    assert f"context of {tiny_pair.context_length}" in encoder.skipped["big"]


def test_the_middle_rule_keeps_the_beginning_and_the_end(tiny_pair):
    text = "BEGIN " + "m" * 200 + " END"
    encoder = PromptEncoder(tiny_pair, MAX_NEW, Fitting(max_prompt_tokens=60, rule="middle"))
    ids = encoder.ids(SuitePrompt("cut", "k", True, text))
    kept = encoder.encoded["cut"].text
    assert len(ids) <= 60 and kept.startswith("BEGIN") and kept.endswith(" END") and len(kept) < len(text)
    assert ids == tiny_pair.encode_chat([{"role": "user", "content": kept}])
    assert encoder.cut["cut"] == len(tiny_pair.text_tokens(text)) - len(tiny_pair.text_tokens(encoder.encoded["cut"].text))
    assert encoder.cut["cut"] > 0 and not encoder.skipped
    about = encoder.about(SuitePrompt("cut", "k", True, text))
    assert about["rule"] == "middle" and about["limit"] == 60
    # the template alone is longer than a tiny budget: skipped, not cut to nothing
    tight = PromptEncoder(tiny_pair, MAX_NEW, Fitting(max_prompt_tokens=16, rule="middle"))
    with pytest.raises(PromptSkipped, match="fewer than"):
        tight.ids(SuitePrompt("cut", "k", True, text))


def test_bad_fitting_options_are_one_line():
    with pytest.raises(BenchError, match="--long-prompts"):
        Fitting(rule="truncate")
    with pytest.raises(BenchError, match="at least 16"):
        Fitting(max_prompt_tokens=3)


def test_a_cached_table_matches_only_the_prompt_and_fit_it_was_built_for():
    prompt = SuitePrompt("1", "k", True, "hello")
    meta = {"prompt_tokens": 40, "prompt": {"sha": prompt.fingerprint, "cut": 0, "context": 1024}}
    assert table_matches(meta, prompt, Fitting(), 48)
    assert not table_matches(meta, SuitePrompt("1", "k", True, "other text"), Fitting(), 48)
    assert not table_matches(meta, prompt, Fitting(max_prompt_tokens=30), 48)  # this run would skip it
    assert not table_matches(meta, prompt, Fitting(), 1000)  # 40 + 1000 tokens exceed the context
    cut = {"prompt_tokens": 60, "prompt": {"sha": prompt.fingerprint, "cut": 90, "context": 1024, "rule": "middle",
                                           "limit": 60}}
    assert table_matches(cut, prompt, Fitting(60, "middle"), 48)
    assert not table_matches(cut, prompt, Fitting(80, "middle"), 48) and not table_matches(cut, prompt, Fitting(), 48)
    later = SuitePrompt("1-t2", "k", True, "more", history=("hello",), group="1")
    with_answers = {"prompt_tokens": 80, "prompt": {"sha": later.fingerprint, "cut": 0, "context": 1024, "answers": 48}}
    assert table_matches(with_answers, later, Fitting(), 48) and not table_matches(with_answers, later, Fitting(), 32)
    assert table_matches({"prompt_tokens": 40}, prompt, Fitting(), 48)  # a table from before: by id alone
    assert not table_matches({"prompt_tokens": 40}, later, Fitting(), 48)


def test_a_later_turn_is_reused_only_after_the_same_earlier_turns_and_answers(tiny_pair, tmp_path):
    """Turn 2's table follows turn 1 and the target's answer as they were cached; when the cached turn 1 changes (its
    cut, its answer), the cached turn 2 no longer matches, found without the models (the re-costing path)."""
    import json

    from disco.tables.lookup import find_cached

    first = SuitePrompt("q-t1", "k", True, "write a poem", group="q")
    second = SuitePrompt("q-t2", "k", True, "and now?", history=(first.prompt,), group="q")
    phase = TablePhase(PairSpec("tiny"), None, tmp_path, MAX_NEW, Here(tiny_pair, progress=False))
    built = phase.ensure([first, second], [])
    assert [r["built_by"] for r in built.rows] == ["here", "here"]
    want = PairSpec("tiny")
    assert find_cached(tmp_path, second, want, MAX_NEW) is not None  # as built: reused
    again = phase.cached([first, second])  # what re-costing finds, without the models
    assert not again.missing and [r["built_by"] for r in again.rows] == ["cache", "cache"]
    assert {p: t.prompt_ids for p, t in again.tables.items()} == {p: t.prompt_ids for p, t in built.tables.items()}
    # the dict of the pair's fields callers gave before there was a PairSpec (disco.bench.batch_run) still works
    old = {"models": "tiny", "engine": "auto", "dtype": "auto", "assistant_precision": "auto"}
    assert find_cached(tmp_path, second, old, MAX_NEW) is not None
    assert find_cached(tmp_path, second, PairSpec("tiny", engine="llamacpp"), MAX_NEW) is None
    path = next(tmp_path.glob("q-t1-*.json"))
    data = json.loads(path.read_text())
    data["reference"] = [t + 1 for t in data["reference"]]  # turn 1 answered otherwise (another build of it)
    path.write_text(json.dumps(data))
    assert find_cached(tmp_path, first, want, MAX_NEW) is not None
    assert find_cached(tmp_path, second, want, MAX_NEW) is None  # its history is not this cache's any more
