"""Acceptance figures as each engine counts them (``disco.decode.acceptance``), from traces counted by hand, and the
glossary that names them (``docs/glossary.md``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from disco.decode import acceptance
from disco.decode.trace import position_acceptance, summarize
from disco.errors import InputError

GLOSSARY = Path(__file__).resolve().parents[2] / "docs" / "glossary.md"
COLUMNS = ["strategy", "iteration", "lookahead", "accepted", "emitted", "stop_reason", "max_lookahead", "new_tokens",
           "elapsed_ms", "iteration_ms", "forward_ms", "draft_calls"]


def _frame(rows, strategy="lane"):
    """rows: (lookahead, accepted, emitted, stop_reason, max_lookahead); the timing columns summarize reads are made
    up (10 ms per iteration)."""
    out, tokens = [], 0
    for i, (lookahead, accepted, emitted, stop, k) in enumerate(rows, start=1):
        tokens += emitted
        out.append((strategy, i, lookahead, accepted, emitted, stop, k, tokens, 10.0 * i, 10.0, 8.0, lookahead))
    return pd.DataFrame(out, columns=COLUMNS)


# A dynamic lane with K = 4, counted by hand:
#   it 1: drafts 4, all 4 accepted, emits 4 + the target's token = 5
#   it 2: drafts 4, 1 accepted, emits 1 + the target's correction = 2
#   it 3: drafts 2 (confidence stop), 0 accepted, emits the correction = 1
#   it 4: a draft discarded as too short: sends 0, emits the target's token = 1
#   it 5: drafts 2, the 2nd is EOS, both accepted: emits 2 (the EOS ends the run, the target's token is dropped:
#         emitted = 2 < accepted + 1 = 3)
HAND = [(4, 4, 5, "max_lookahead", 4), (4, 1, 2, "max_lookahead", 4), (2, 0, 1, "confidence", 4),
        (0, 0, 1, "short", 4), (2, 2, 2, "eos", 4)]
# totals: drafted 4+4+2+0+2 = 12, accepted 4+1+0+0+2 = 7, emitted 5+2+1+1+2 = 11, iterations 5, drafts (lookahead > 0) 4


def test_ours_is_summarize_counted_by_hand():
    got = acceptance.ours(_frame(HAND))
    assert got == {"target_calls": 5, "drafted": 12, "accepted": 7, "acceptance_rate": pytest.approx(7 / 12),
                   # every row drafts by policy (none is autoregressive): 12 / 5, the discarded draft's 0 included
                   "mean_lookahead": pytest.approx(12 / 5)}
    summary = summarize("lane", _frame(HAND))
    assert {key: summary[key] for key in got} == pytest.approx(got)


def test_vllm_counted_by_hand():
    got = acceptance.vllm(_frame(HAND))
    # per draft: the discarded draft (it 4) is no draft for vLLM
    assert got["num_drafts"] == 4
    assert got["num_draft_tokens"] == 12 and got["num_accepted_tokens"] == 7
    assert got["acceptance_rate"] == pytest.approx(7 / 12)
    assert got["mean_acceptance_length"] == pytest.approx(1 + 7 / 4)  # 2.75, the EOS-dropped token counted
    # k = the K in force, 4; drafts with accepted >= 1: its 1, 2, 5 = 3; >= 2: its 1, 5 = 2; >= 3: it 1; >= 4: it 1
    assert got["num_accepted_tokens_per_pos"] == [3, 2, 1, 1]
    assert got["per_position_acceptance_rate"] == pytest.approx([3 / 4, 2 / 4, 1 / 4, 1 / 4])
    # a longer vector (num_speculative_tokens 6): positions beyond every draft count as not accepted
    assert acceptance.vllm(_frame(HAND), k=6)["per_position_acceptance_rate"] == pytest.approx(
        [0.75, 0.5, 0.25, 0.25, 0.0, 0.0])


def test_llamacpp_counted_by_hand():
    got = acceptance.llamacpp(_frame(HAND))
    assert got["n_drafted"] == 12 and got["n_accept"] == 7
    assert got["accept_pct"] == pytest.approx(100 * 7 / 12)  # 58.333 %
    # every pass counts accepted + 1: 5 + 2 + 1 + 1 + 3 = 12, one more than the 11 tokens emitted (the EOS cut)
    assert got["n_predict"] == 12


def test_sglang_counted_by_hand():
    got = acceptance.sglang(_frame(HAND))
    assert got["spec_verify_ct"] == 5  # every target pass verifies, the one with nothing drafted too
    assert got["accept_length"] == pytest.approx(11 / 5)  # emitted tokens per pass: 2.2
    # accepted up to the stop: emitted - 1 per pass = 4 + 1 + 0 + 0 + 1 = 6 (it 5: 2 emitted, the EOS the last)
    assert got["accept_token_num"] == 6
    assert got["draft_token_num"] == 20  # 5 passes x K 4
    assert got["accept_rate"] == pytest.approx(6 / 20)


def test_per_position_counted_by_hand():
    table = acceptance.per_position(_frame(HAND), kmax=5).set_index("position")
    # drafts: its 1, 2, 3, 5 (lookahead, accepted) = (4, 4), (4, 1), (2, 0), (2, 2)
    # 1: all 4 reached, 3 accepted; 2: reached by (4, 4), (4, 1), (2, 2) = 3, accepted by 2
    # 3: reached by (4, 4) only: (2, 2) accepted all it drafted, so position 3 is unobserved for it, not rejected
    # 4: (4, 4) again; 5: no draft reached it
    assert table["reached"].tolist() == [4, 3, 1, 1, 0]
    assert table["accepted_at"].tolist() == [3, 2, 1, 1, 0]
    assert table["had_token"].tolist() == [4, 4, 2, 2, 0]
    assert table["drafts"].tolist() == [4] * 5
    assert table["conditional_rate"].tolist()[:4] == pytest.approx([3 / 4, 2 / 3, 1.0, 1.0])
    assert math.isnan(table.loc[5, "conditional_rate"])  # unobserved
    assert table["unconditional_rate"].tolist() == pytest.approx([0.75, 0.5, 0.25, 0.25, 0.0])
    # the conditional counts are the ones the Race tab plots
    plotted = position_acceptance(_frame(HAND)).set_index("position")
    assert plotted["reached"].tolist() == table["reached"].tolist()[:4]
    assert plotted["rate"].tolist() == pytest.approx(table["conditional_rate"].tolist()[:4])


def test_a_position_beyond_a_draft_is_unobserved_not_rejected():
    # two drafts of 2, both fully accepted, and one of 4 that lost its 3rd token
    frame = _frame([(2, 2, 3, "confidence", 4), (2, 2, 3, "confidence", 4), (4, 2, 3, "max_lookahead", 4)])
    table = acceptance.per_position(frame).set_index("position")
    assert table.loc[3, "reached"] == 1 and table.loc[3, "conditional_rate"] == 0.0  # only the draft of 4 says
    assert table.loc[3, "unconditional_rate"] == 0.0  # vLLM's: the short drafts count as not accepted
    assert table.loc[2, "conditional_rate"] == 1.0 and math.isnan(table.loc[4, "conditional_rate"])


def test_synthetic_acceptance_rates():
    assert acceptance.synthetic_acceptance_rates(_frame(HAND), 4) == [0.75, 0.5, 0.25, 0.25]
    assert acceptance.synthetic_acceptance_rates(_frame(HAND), 2) == [0.75, 0.5]
    assert acceptance.synthetic_acceptance_rates(_frame(HAND), 6) == [0.75, 0.5, 0.25, 0.25, 0.0, 0.0]
    # 1 + the rates' sum is vLLM's mean acceptance length when k covers every draft
    assert 1 + sum(acceptance.synthetic_acceptance_rates(_frame(HAND), 4)) == pytest.approx(
        acceptance.vllm(_frame(HAND))["mean_acceptance_length"])
    # three drafts (3, 1), (3, 2), (1, 1): >= 1 accepted 3/3, >= 2 1/3 -> 0.3333 (4 decimals), >= 3 none
    thirds = _frame([(3, 1, 2, "confidence", 3), (3, 2, 3, "confidence", 3), (1, 1, 2, "confidence", 3)])
    assert acceptance.synthetic_acceptance_rates(thirds, 3) == [1.0, 0.3333, 0.0]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("rows", [HAND, [(3, 3, 4, "max_lookahead", 3)] * 3,
                                  [(5, a, a + 1, "confidence", 5) for a in (0, 5, 2, 1, 4, 3, 5)]])
def test_synthetic_rates_meet_vllms_rules(rows, k):
    """vLLM's _resolve_synthetic_acceptance_rates: length num_speculative_tokens, each in [0, 1], non-increasing; and
    only with rejection_sample_method synthetic."""
    config = acceptance.vllm_speculative_config(_frame(rows), k)
    rates = config["synthetic_acceptance_rates"]
    assert config["num_speculative_tokens"] == k == len(rates)
    assert config["rejection_sample_method"] == "synthetic"
    assert all(0.0 <= r <= 1.0 for r in rates)
    assert all(rates[i] <= rates[i - 1] for i in range(1, k))
    assert all(r == round(r, 4) for r in rates)


def test_running_minimum():
    assert acceptance.non_increasing([0.5, 0.7, 0.4, 0.6, 0.1]) == [0.5, 0.5, 0.4, 0.4, 0.1]
    assert acceptance.non_increasing([]) == []


def test_bad_k_is_a_user_error():
    for k in (0, -1, 2.5, True):
        with pytest.raises(InputError):
            acceptance.synthetic_acceptance_rates(_frame(HAND), k)


AUTOREGRESSIVE = [(0, 0, 1, "none", 0)] * 3


@pytest.mark.parametrize("frame", [None, _frame([]), pd.DataFrame(), _frame(AUTOREGRESSIVE)],
                         ids=["none", "empty", "no-columns", "no-drafts"])
def test_nothing_drafted_gives_nan_not_a_crash(frame):
    got = acceptance.figures(frame)
    for column in ("acceptance_rate", "vllm_acceptance_rate", "vllm_mean_acceptance_length", "llamacpp_accept_pct",
                   "sglang_accept_length", "sglang_accept_rate"):
        assert math.isnan(got[column]), column
    assert got["vllm_num_drafts"] == got["llamacpp_n_drafted"] == got["sglang_spec_verify_ct"] == 0
    assert got["vllm_per_position_acceptance_rate"] == []
    rates = acceptance.synthetic_acceptance_rates(frame, 3)
    assert len(rates) == 3 and all(math.isnan(r) for r in rates)
    table = acceptance.per_position(frame, 2)
    assert len(table) == 2 and table["conditional_rate"].isna().all() and table["unconditional_rate"].isna().all()
    with pytest.raises(InputError):
        acceptance.vllm_speculative_config(frame, 3)


def test_ours_keeps_summarizes_empty_and_autoregressive_values():
    assert math.isnan(acceptance.ours(_frame([]))["mean_lookahead"])  # no rows: nan, as summarize
    assert acceptance.ours(_frame(AUTOREGRESSIVE))["mean_lookahead"] == 0.0  # drafts nothing by design: 0.0
    assert acceptance.llamacpp(_frame(AUTOREGRESSIVE))["n_predict"] == 3


def test_summarize_appends_the_engine_columns_after_its_own():
    summary = summarize("lane", _frame(HAND))
    keys = list(summary)
    assert keys[-len(acceptance.SUMMARY_COLUMNS):] == list(acceptance.SUMMARY_COLUMNS)
    assert keys[:keys.index("overhead_pct") + 1] == [
        "strategy", "new_tokens", "seconds", "tokens_per_s", "iterations", "target_calls", "draft_calls", "drafted",
        "accepted", "acceptance_rate", "mean_lookahead", "ttft_ms", "decode_tokens_per_s", "overhead_pct"]
    assert summary["vllm_acceptance_rate"] == pytest.approx(7 / 12)
    assert summary["vllm_mean_acceptance_length"] == pytest.approx(2.75)
    assert summary["llamacpp_accept_pct"] == pytest.approx(700 / 12)
    assert summary["sglang_accept_length"] == pytest.approx(2.2)
    # another lane's rows are not counted, and an absent lane has the same keys
    both = pd.concat([_frame(HAND), _frame(AUTOREGRESSIVE, "autoregressive")], ignore_index=True)
    pooled = summarize("lane", both)
    assert {c: pooled[c] for c in acceptance.SUMMARY_COLUMNS} == {c: summary[c] for c in acceptance.SUMMARY_COLUMNS}
    assert list(summarize("missing", both)) == keys
    assert math.isnan(summarize("autoregressive", both)["vllm_mean_acceptance_length"])


def test_definitions_name_every_figure_once():
    columns = [row[0] for row in acceptance.DEFINITIONS]
    assert len(columns) == len(set(columns))
    assert all(len(row) == 4 and all(isinstance(cell, str) and cell for cell in row) for row in acceptance.DEFINITIONS)
    assert set(acceptance.figures(_frame(HAND))) <= set(columns)
    assert set(acceptance.POSITION_COLUMNS) - {"position"} <= set(columns)
    assert set(acceptance.SUMMARY_COLUMNS) <= set(columns)
    assert "synthetic_acceptance_rates" in columns


def test_the_glossary_is_current():
    """Every column of DEFINITIONS is a row of the glossary's table, and the table names no other column."""
    text = GLOSSARY.read_text()
    listed = re.findall(r"^\|\s*`([a-z_]+)`\s*\|", text, flags=re.MULTILINE)
    columns = [row[0] for row in acceptance.DEFINITIONS]
    assert sorted(listed) == sorted(columns)
    for column, formula, engine, _ in acceptance.DEFINITIONS:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{column}` |"))
        assert engine in row, column


def _timed(prompt, strategy, implementation, drafted, accepted, seconds=1.0):
    return {"mode": "timed", "prompt_id": prompt, "strategy": strategy, "implementation": implementation,
            "seconds": seconds, "new_tokens": 16, "decode_tokens_per_s": 16.0, "speedup": 1.2, "same_as_ours": True,
            "target_passes": 9, "overhead_pct": 1.0, "drafted": drafted, "accepted": accepted}


def test_llama_cpp_statistics_sit_beside_ours_in_the_peer_report():
    """The peer table sets llama-speculative-simple's printed n_drafted / n_accept beside ours, summed over the
    prompts where it printed them, under its definitions (hand-counted)."""
    from types import SimpleNamespace

    from disco.bench.analysis import peer_frame
    from disco.bench.report_md import peer_md

    runs = pd.DataFrame([
        _timed("p1", "pmin:0.4:3", "ours", 12, 9), _timed("p1", "llama:pmin:0.4:3", "llama.cpp", 12, 9),
        _timed("p2", "pmin:0.4:3", "ours", 10, 4), _timed("p2", "llama:pmin:0.4:3", "llama.cpp", 11, 4),
        _timed("p1", "autoregressive", "ours", None, None), _timed("p1", "llama:autoregressive", "llama.cpp", None, None),
    ])
    peers = peer_frame(pd.DataFrame(), runs).set_index("strategy")
    row = peers.loc["pmin:0.4:3"]
    assert (row.llamacpp_n_drafted_ours, row.llamacpp_n_drafted_peer) == (22, 23)
    assert (row.llamacpp_n_accept_ours, row.llamacpp_n_accept_peer) == (13, 13)
    assert math.isclose(row.llamacpp_accept_pct_ours, 100 * 13 / 22)
    assert math.isclose(row.llamacpp_accept_pct_peer, 100 * 13 / 23)
    assert row.llamacpp_same_counts is False or row.llamacpp_same_counts == False  # noqa: E712 (numpy bool)
    assert math.isnan(peers.loc["autoregressive"].get("llamacpp_n_drafted_peer", math.nan))  # llama-bench drafts nothing
    text = peer_md(SimpleNamespace(meta={}), peers.reset_index())
    assert "llama.cpp's printed statistics beside ours" in text
    assert "| `pmin:0.4:3` | 2 | 22 / 23 | 13 / 13 | 59.09 / 56.52 | no |" in text
