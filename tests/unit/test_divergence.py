"""Exactness you can see: every greedy divergence from the baseline is explained and classified, and the oracle
stays an upper bound in bf16."""

from __future__ import annotations

import contextlib

import pytest
import torch

from disco.decode import divergence
from disco.policies import parse_strategy
from disco.decode.settings import DecodeSettings
from disco.decode.race import run_all
from disco.decode.trace import TokenRecord

PROMPT = "def fibonacci(n):"


def _tok(token, logit, runner, runner_logit, pos=3):
    return TokenRecord("x", pos, token, f"t{token}", "autoregressive", float("nan"), 1, logit, runner, runner_logit)


def test_rule_on_hand_made_records():
    same = [_tok(1, 10.0, 2, 9.0, 0), _tok(2, 8.0, 3, 7.0, 1)]
    base = same + [_tok(5, 10.00, 6, 9.95, 2)]
    lane = same + [_tok(6, 9.97, 5, 9.93, 2)]
    d = divergence.explain(base, lane, "bf16")
    assert d["position"] == 2 and d["kind"] == divergence.NEAR_TIE and d["margins_exact"]
    assert d["baseline_margin"] == pytest.approx(0.05) and d["lane_margin"] == pytest.approx(0.04)
    assert d["tolerance"] == pytest.approx(4 * 2 ** -7 * 10.0)
    assert d["baseline_logits"] == {"baseline_token": 10.0, "lane_token": 9.95}
    # the same margins are far outside fp32's rounding: a real mismatch there
    assert divergence.explain(base, lane, "fp32")["kind"] == divergence.MISMATCH
    # a wide margin in bf16 is a mismatch too
    wide = same + [_tok(6, 12.0, 5, 9.0, 2)]
    assert divergence.explain(base, wide, "bf16")["kind"] == divergence.MISMATCH
    # the lane's token was not even the baseline's runner-up: not two tied tokens
    third = same + [_tok(7, 9.99, 5, 9.98, 2)]
    d = divergence.explain(base, third, "bf16")
    assert d["kind"] == divergence.MISMATCH and not d["margins_exact"]
    assert divergence.explain(same, same + [_tok(9, 1.0, 8, 0.5, 2)], "bf16") is None  # a prefix, no divergence
    assert "near-tie at token 2" in divergence.short(divergence.explain(base, lane, "bf16"))


@contextlib.contextmanager
def forced_choice(pair, output_position: int, prompt_len: int, margin_one: float, margin_many: float):
    """Make the target's runner-up at ``output_position`` its choice in multi-token passes and not in one-token
    passes: logit(runner-up) = logit(top) - margin_one in 1-token passes, logit(top) + margin_many in others."""
    row_position = prompt_len + output_position - 1  # the logits row that predicts that output token

    def hook(module, args, kwargs, out):
        if kwargs.get("cache") is None:  # warm-up passes
            return out
        n = kwargs["input_ids"].shape[1]
        total = kwargs["cache"].get_seq_length()
        keep = out.logits.shape[1]
        for j in range(keep):
            if total - keep + j == row_position:
                row = out.logits[0, j]
                top2 = torch.topk(row, 2)
                best, runner = top2.indices.tolist()
                if margin_one == "ulp":  # one unit in the last place of the dtype, either side of the top logit
                    inf = torch.tensor(float("inf"), dtype=row.dtype)
                    row[runner] = torch.nextafter(row[best], inf if n > 1 else -inf)
                else:
                    row[runner] = row[best] + (margin_many if n > 1 else -margin_one)
        return out

    handle = pair.target.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("margins,kind", [(("ulp", "ulp"), divergence.NEAR_TIE), ((1e-3, 3.0), divergence.MISMATCH)])
def test_forced_divergences_are_classified(tiny_pair, margins, kind):
    """fp32: a tie broken by one ulp either way is a near-tie; a lane whose verification prefers another token by
    3 logits (a corrupted verification) is a mismatch."""
    prompt_len = len(tiny_pair.encode(PROMPT, False))
    position = 6
    with forced_choice(tiny_pair, position, prompt_len, *margins):
        final = run_all(tiny_pair, PROMPT, ["autoregressive", "static:4"], DecodeSettings(max_new_tokens=24))
    summary = {s["strategy"]: s for s in final.summaries()}["static:4"]
    assert summary["identical_to_autoregressive"] is False
    d = summary["divergence"]
    assert d["position"] == position and d["margins_exact"] and d["kind"] == kind, d
    frame = final.export_iterations()
    lane = frame[frame["strategy"] == "static:4"]
    assert set(lane["divergence_position"]) == {position} and set(lane["divergence_kind"]) == {kind}
    assert frame.loc[frame["strategy"] == "autoregressive", "divergence_kind"].isna().all()


def test_near_tie_within_bf16_rounding_on_the_tiny_pair():
    """A tie broken by one bf16 ulp either way, in a bf16 run, is a near-tie."""
    from disco.models import load_pair

    pair = load_pair("tiny", dtype="bf16")
    prompt_len = len(pair.encode(PROMPT, False))
    with forced_choice(pair, 5, prompt_len, "ulp", "ulp"):
        final = run_all(pair, PROMPT, ["autoregressive", "static:3"], DecodeSettings(max_new_tokens=16))
    d = {s["strategy"]: s for s in final.summaries()}["static:3"]["divergence"]
    assert d is not None and d["position"] == 5 and d["dtype"] == "bf16"
    assert d["kind"] == divergence.NEAR_TIE, d


def test_the_oracle_is_an_upper_bound_in_bf16():
    from disco.models import load_pair

    pair = load_pair("tiny", dtype="bf16")
    statics = [f"static:{k}" for k in (1, 2, 3, 4, 6)]
    for prompt in (PROMPT, "The quick brown fox", "SELECT * FROM users WHERE"):
        final = run_all(pair, prompt, ["autoregressive", "oracle:8"] + statics, DecodeSettings(max_new_tokens=40))
        by = {s["strategy"]: s for s in final.summaries()}
        oracle = by["oracle:8"]
        assert oracle["acceptance_rate"] == 1.0, prompt
        assert all(oracle["target_calls"] <= by[s]["target_calls"] for s in statics), prompt


def test_the_oracle_rederives_its_reference_after_a_forced_divergence(tiny_pair):
    prompt_len = len(tiny_pair.encode(PROMPT, False))
    with forced_choice(tiny_pair, 4, prompt_len, 1e-3, 1e-3):
        final = run_all(tiny_pair, PROMPT, ["autoregressive", "oracle:8", "static:3"], DecodeSettings(max_new_tokens=32))
    by = {s["strategy"]: s for s in final.summaries()}
    oracle = next(d for d in final.decoders if d.strategy == "oracle:8")
    assert by["oracle:8"]["acceptance_rate"] == 1.0
    assert by["oracle:8"]["target_calls"] <= by["static:3"]["target_calls"]
    if not by["oracle:8"]["identical_to_autoregressive"]:
        assert oracle.reference_rederived >= 1


def test_bench_timed_rows_and_report_carry_the_divergence(tiny_pair):
    """The benchmark's timed runs explain a divergence like the CLI and the app do (runs.csv, summary, report)."""
    import pandas as pd

    from disco import suites
    from disco.bench import analysis, peer, runs

    prompt = suites.SuitePrompt(id="forced", kind="code", prompt=PROMPT, chat=False)
    prompt_len = len(tiny_pair.encode(PROMPT, False))
    meta = runs.environment(tiny_pair)
    meta["max_new_tokens"] = 24
    with forced_choice(tiny_pair, 6, prompt_len, "ulp", "ulp"):
        rows, _ = peer.timed_prompt(tiny_pair, prompt, tiny_pair.encode(PROMPT, False), [parse_strategy("autoregressive"), parse_strategy("static:4")], 24, meta,
                                          peer=False)
    by = {r["strategy"]: r for r in rows}
    assert by["static:4"]["identical_to_autoregressive"] is False
    assert by["static:4"]["divergence"] == divergence.NEAR_TIE
    assert "near-tie at token 6" in by["static:4"]["divergence_detail"]
    assert by["autoregressive"]["divergence"] == ""
    summary = analysis.summarize_runs(pd.DataFrame(rows))
    row = summary[(summary["strategy"] == "static:4") & (summary["kind"] == "all")].iloc[0]
    assert row["divergences"] == "near-tie 1" and not row["all_identical"]
