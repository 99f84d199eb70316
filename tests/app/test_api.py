"""The ``compare`` endpoint through gradio_client, against the app launched in this process (tiny preset)."""

from __future__ import annotations

import pandas as pd
import pytest
from gradio_client import Client

import app
from disco.app.race_tab import OUTPUT_LABELS
from disco.app.lanes import SUMMARY_COLUMNS

ITERATIONS_CSV, TOKENS_CSV, SUMMARY = (OUTPUT_LABELS.index(n) for n in ("iterations_csv", "tokens_csv", "summary"))
SAME = SUMMARY_COLUMNS.index("same as baseline")


@pytest.fixture(scope="module")
def client(monkeypatch_module, serve_app):
    monkeypatch_module.setenv("DISCO_MODELS", "tiny")
    with serve_app(app.build_demo()) as url:
        yield Client(url, verbose=False)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_only_prompt_is_required(client):
    info = client.view_api(return_format="dict", print_info=False)
    params = info["named_endpoints"]["/compare"]["parameters"]
    required = [p["parameter_name"] for p in params if not p["parameter_has_default"]]
    assert required == ["prompt"]


def test_compare_with_only_a_prompt_returns_a_trace_csv(client):
    result = client.predict("Write a haiku about caches.", api_name="/compare")
    status, iterations_csv, tokens_csv = result[0], result[ITERATIONS_CSV], result[TOKENS_CSV]
    assert "Done" in status
    trace = pd.read_csv(iterations_csv)
    tokens = pd.read_csv(tokens_csv)
    assert set(trace["strategy"]) == {"autoregressive", "static:5", "threshold:0.4:20"}
    assert (trace["models"] == "tiny").all() and trace["dtype"].notna().all() and trace["device"].notna().all()
    assert (trace["max_new_tokens"] == 64).all()
    # the engine's invariants, row by row and per strategy
    assert (trace["accepted"] <= trace["lookahead"]).all()
    assert (trace["lookahead"] <= trace["max_lookahead"]).all()
    for strategy, rows in trace.groupby("strategy"):
        assert list(rows["iteration"]) == list(range(1, len(rows) + 1)), strategy
        assert rows["emitted"].sum() == rows["new_tokens"].iloc[-1], strategy
        assert rows["elapsed_ms"].is_monotonic_increasing, strategy
        assert rows["new_tokens"].iloc[-1] == len(tokens[tokens["strategy"] == strategy]), strategy
    dynamic = trace[trace["strategy"] == "threshold:0.4:20"]
    assert (dynamic["threshold"] == 0.4).all()
    confident = dynamic[dynamic["stop_reason"] == "max_lookahead"]
    assert (confident["lookahead"] == confident["max_lookahead"]).all()


def test_prompt_lookup_lanes_and_the_positions_csv(client):
    """Lookup lanes (no assistant) race through the API; the positions CSV is the iterations CSV's per-position
    acceptance, with the run's settings on every row."""
    from disco.decode.trace import position_acceptance

    prompt = "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"
    result = client.predict(prompt, lane_a="lookup", lane_b="copy", k=4, max_lookahead=8, max_new_tokens=32,
                            chat=False, api_name="/compare")
    assert "Done" in result[0] and "yes" in str(result[SUMMARY]["data"])
    trace = pd.read_csv(result[ITERATIONS_CSV])
    assert set(trace["strategy"]) == {"autoregressive", "lookup:4:2", "copy:8:2"}
    lookup = trace[trace["strategy"] != "autoregressive"]
    assert (lookup["drafter"] == "lookup").all() and (lookup["draft_calls"] == 0).all()
    assert (lookup["assistant_precision"] == "none").all()
    positions = pd.read_csv(result[OUTPUT_LABELS.index("positions_csv")])
    expected = position_acceptance(trace[trace["strategy"] != "autoregressive"])
    assert len(positions) == len(expected) > 0 and (positions["models"] == "tiny").all()
    pd.testing.assert_frame_equal(positions[expected.columns].reset_index(drop=True), expected, check_dtype=False)


def test_compare_with_keywords_and_bad_input(client):
    result = client.predict(prompt="abc", lane_a="heuristic", lane_b="threshold", threshold=0.75, max_lookahead=6,
                            max_new_tokens=8, baseline=False, chat=False, api_name="/compare")
    trace = pd.read_csv(result[ITERATIONS_CSV])
    assert set(trace["strategy"]) == {"heuristic:5", "threshold:0.75:6"}
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict("  ", api_name="/compare")
    with pytest.raises(Exception, match="K must be between 1 and 128"):  # compare checks its own inputs
        client.predict("abc", k=0, api_name="/compare")
    with pytest.raises(Exception, match="between 1 and 128"):  # the engine's StrategyError, as gr.Error
        client.predict("abc", lane_a="static:999", api_name="/compare")


def test_each_lane_chooses_its_assistant(client):
    """One run shows the same policy with the model assistant and the int8 one side by side."""
    result = client.predict("def add(a, b):", lane_a="static", lane_b="static", k=4, max_new_tokens=24, chat=False,
                            lane_a_assistant="model", lane_b_assistant="int8", api_name="/compare")
    trace = pd.read_csv(result[ITERATIONS_CSV])
    by_lane = trace.groupby("strategy")["assistant_precision"].agg(set).to_dict()
    assert by_lane == {"autoregressive": {"none"}, "static:4@model": {"model"}, "static:4@int8": {"int8"}}
    summary = result[SUMMARY]
    rows = {r[0]: r for r in summary["data"]}
    assert rows["static:4@int8"][1] == "int8" and rows["static:4@int8"][SAME] == "yes"  # identical to the baseline


def test_the_auto_lane_runs_the_machine_profile_recommendation(client):
    import time

    deadline = time.monotonic() + 240
    while True:  # the tiny pair's profile is measured in the background after start-up (seconds)
        try:
            result = client.predict("def add(a, b):", lane_a="auto", lane_b="static", max_new_tokens=16, chat=False,
                                    api_name="/compare")
            break
        except Exception as exc:
            assert "still being measured" in str(exc), exc
            assert time.monotonic() < deadline, "the machine profile never became ready"
            time.sleep(1.0)
    trace = pd.read_csv(result[ITERATIONS_CSV])
    auto = [s for s in set(trace["strategy"]) if s not in ("autoregressive", "static:5")]
    # the recommendation, or the target alone where no speculative setting beat it (then it runs once)
    assert (len(auto) == 1 and "@" in auto[0]) or (auto == [] and "auto = autoregressive" in result[0])
    # and the setting to take away, for the engines people deploy with
    assert "auto's setting for transformers, llama.cpp and vLLM" in result[0]
    assert ("num_assistant_tokens" in result[0] and "--spec-draft-n-max" in result[0]) or \
        "leave speculative decoding off" in result[0]


@pytest.mark.parametrize("lane_a,lane_b,expect", [
    ("adaptive", "entropy", {"adaptive:0.3:12", "entropy:0.3:12"}),
    ("cumulative", "costaware", {"cumulative:0.3:12", "costaware:12"}),
    ("disco", "cumulative:0.8:4", {"disco:12", "cumulative:0.8:4"}),
])
def test_the_new_stopping_rules_run_as_lanes(client, lane_a, lane_b, expect):
    """Every new rule is a lane: its parameters come from the shared sliders its metadata names."""
    result = client.predict("def add(a, b):", lane_a=lane_a, lane_b=lane_b, threshold=0.3, max_lookahead=12,
                            max_new_tokens=24, chat=False, api_name="/compare")
    trace = pd.read_csv(result[ITERATIONS_CSV])
    assert set(trace["strategy"]) == expect | {"autoregressive"}
    rows = {r[0]: r for r in result[SUMMARY]["data"]}
    assert all(rows[s][SAME] == "yes" for s in expect)  # identical to the baseline
    assert (trace.groupby("strategy")["new_tokens"].max() == 24).all()
