"""The per-kind answer to "who drafts" (``disco.bench.drafters``) on a hand-made runs table."""

from __future__ import annotations

import pandas as pd
import pytest

from disco.bench.drafters import drafter_answer, drafter_answer_md, family, paired, paired_md

H = "hybrid:ngram:12:48+threshold:0.4:20"
SPEEDS = {  # strategy -> (code prompts' speed-up, copy prompts' speed-up)
    "autoregressive": (1.0, 1.0), "threshold:0.4:20": (2.0, 2.0), "copy:16:3": (1.0, 3.0), "oracle:20": (5.0, 5.0),
    H: (2.0, 4.0), "hybrid:lookup:10+threshold:0.4:20": (1.5, 3.5),
}


def _runs(split: str) -> pd.DataFrame:
    rows = []
    for spec, (code, copy) in SPEEDS.items():
        for kind, value in (("code", code), ("copy", copy)):
            for i in range(2):
                drafted = 0 if spec == "autoregressive" or (spec == "copy:16:3" and kind == "code") else 5
                rows.append({"mode": "replay", "strategy": spec, "kind": kind, "prompt_id": f"{kind}{i}{split}",
                             "split": split, "speedup": value, "drafted": drafted})
    return pd.DataFrame(rows)


def test_families():
    assert [family(s) for s in ("copy:16", "ngram", "threshold:0.4:20@int8", H, "oracle", "autoregressive",
                                "hf:static:3")] == ["context", "context", "assistant", "hybrid", None, None, None]


def test_the_best_of_each_family_per_kind_of_the_test_split():
    frame = drafter_answer(pd.concat([_runs("train"), _runs("test")]))
    rows = {r["kind"]: r for r in frame.to_dict("records")}
    assert rows["copy"]["best_context"] == "copy:16:3" and rows["copy"]["best_hybrid"] == H
    assert rows["copy"]["hybrid_over_better"] == pytest.approx(4.0 / 3.0)
    assert pd.isna(rows["code"]["best_context"])  # copy drafted nothing on code: it does not count there
    assert rows["code"]["hybrid_over_better"] == pytest.approx(1.0)
    assert rows["all"]["chosen_hybrid"] == H and rows["copy"]["chosen_hybrid_test"] == pytest.approx(4.0)
    text = drafter_answer_md(frame)
    assert "| copy | 2 |" in text and "nan" not in text


def test_no_hybrid_no_section():
    runs = _runs("test")
    assert drafter_answer(runs[~runs["strategy"].str.startswith("hybrid")]).empty


def test_each_hybrid_against_its_own_assistant_rule():
    frame = paired(_runs("test"))
    row = frame[(frame["kind"] == "code") & (frame["context"] == "lookup:10")].iloc[0]
    assert row["min"] == pytest.approx(0.75) and row["pairs"] == 1
    assert "`ngram:12:48`" in paired_md(frame)
