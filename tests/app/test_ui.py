"""The app's logic called directly with the tiny preset: no server, no browser."""

from __future__ import annotations

import re
import threading

import gradio as gr
import pandas as pd
import plotly.graph_objects as go
import pytest

from disco.app import lanes, loader as loader_mod, plots, race_tab as ui, session
from disco.policies import parse_strategy
from disco.decode.settings import DecodeSettings
from disco.errors import InputError
from disco.models import TINY
from disco.decode.race import run_all
from disco.decode.trace import SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT

N_TOKENS = 16


@pytest.fixture(scope="module")
def pair(tiny_pair):  # the session's tiny pair (tests/conftest.py)
    return tiny_pair


@pytest.fixture(scope="module")
def updates(pair):
    """Every update one short run streams (intervals 0: an update, figures included, after every lane step)."""
    return list(ui.compare(pair, "def add(a, b):", max_new_tokens=N_TOKENS, interval=0.0, plot_interval=0.0))


@pytest.fixture(scope="module")
def snapshot(pair):
    return run_all(pair, "Once upon a time", ["autoregressive", "static:4", "threshold:0.4:12"],
                   DecodeSettings(max_new_tokens=N_TOKENS))


def _token_count(lanes: str, strategy: str) -> int:
    card = lanes.split(f'data-strategy="{strategy}"', 1)[1].split('class="disco-lane"', 1)[0]
    return len(re.findall(r'<span class="t-', card))


# ------------------------------------------------------------------------------------------------
# controls -> specs


class _Profile:
    """What the auto lane reads of this machine's profile: its recommendation."""

    def __init__(self, auto: str):
        self.recommended = {"auto": auto}


def spec(*args, **kwargs) -> str:
    return ui.lane_policy(*args, **kwargs).spec


def specs(*args, **kwargs) -> tuple[list[str], list[str]]:
    lanes, notes = ui.lane_policies(*args, **kwargs)
    return [p.spec for p in lanes], notes


def test_lane_specs_from_controls():
    assert spec("static", 7, 0.4, 20) == "static:7"
    assert spec("heuristic", 3, 0.4, 20) == "heuristic:3"
    assert spec("threshold", 5, 0.30000000000000004, 12.0) == "threshold:0.3:12"
    assert spec("oracle", 5, 0.4, 9) == "oracle:9"
    assert spec(" threshold:0.2:6 ", 5, 0.4, 9) == "threshold:0.2:6"  # typed spec used verbatim
    strategies, notes = specs("static", "threshold", 5, 0.4, 20, True)
    assert strategies == ["autoregressive", "static:5", "threshold:0.4:20"] and notes == []
    strategies, notes = specs("static", "static", 5, 0.4, 20, False)
    assert strategies == ["static:5"] and len(notes) == 2  # duplicate dropped, no baseline


def test_every_engine_kind_is_offered():
    from disco.policies import parse_strategy, policy_kinds

    assert set(ui.LANE_KINDS) == {cls.kind for cls in policy_kinds()} - {"autoregressive"} | {"auto"}
    for kind in ui.LANE_KINDS:
        parse_strategy(spec(kind, profile=_Profile("static:3@int8")))  # every default spec is valid


def test_lane_assistants_and_the_auto_lane():
    assert spec("static", 4, assistant="int8") == "static:4@int8"
    assert spec("static:2@model", assistant="int8") == "static:2@model"  # a typed suffix wins
    assert spec("auto", profile=_Profile("threshold:0.3:10@int8")) == "threshold:0.3:10@int8"
    assert spec("auto", assistant="model", profile=_Profile("threshold:0.3:10@int8")) == "threshold:0.3:10@model"
    with pytest.raises(InputError, match="still being measured"):
        spec("auto", profile=None)
    # where speculation does not pay, auto is the target alone: it joins the baseline instead of doubling it
    assert spec("auto", assistant="int8", profile=_Profile("autoregressive")) == "autoregressive"
    strategies, notes = specs("auto", "static", 5, 0.4, 20, True, profile=_Profile("autoregressive"))
    assert strategies == ["autoregressive", "static:5"] and "auto = autoregressive" in notes[0]
    with pytest.raises(InputError, match="unknown assistant"):
        spec("static", assistant="fp8")
    # the same policy with both assistants: two lanes, side by side
    strategies, notes = specs("static", "static", 5, 0.4, 20, True, ("model", "int8"))
    assert strategies == ["autoregressive", "static:5@model", "static:5@int8"] and notes == []


# ------------------------------------------------------------------------------------------------
# the streamed run


def test_compare_streams_growing_text_figures_and_final_csv(updates):
    assert len(updates) >= 3
    assert all(len(u) == len(ui.OUTPUT_LABELS) for u in updates)
    first, *running, final = updates
    assert "Starting" in first[0]
    counts = [_token_count(u[1], "threshold:0.4:20") for u in running]
    assert counts == sorted(counts) and counts[-1] > counts[0]  # the dynamic lane's text grows
    for u in running:
        assert "Running" in u[0]
        assert all(isinstance(f, go.Figure) for f in u[2:7])
        assert all(isinstance(x, dict) and x.get("__type__") == "update" for x in u[8:11])  # no CSV until the end
    assert "Done" in final[0]
    assert all(isinstance(f, go.Figure) and f.data for f in final[2:7])
    race = final[2]
    assert {t.name.split(" · ")[0] for t in race.data} == {"autoregressive", "static:5", "threshold:0.4:20"}
    summary = final[ui.OUTPUT_LABELS.index("summary")]
    assert list(summary["lane"]) == ["autoregressive", "static:5", "threshold:0.4:20"]
    assert (summary["new tokens"] == N_TOKENS).all()
    iterations = pd.read_csv(final[ui.OUTPUT_LABELS.index("iterations_csv")])
    tokens = pd.read_csv(final[ui.OUTPUT_LABELS.index("tokens_csv")])
    assert set(iterations["strategy"]) == set(summary["lane"])
    assert {"models", "dtype", "device", "max_new_tokens", "threshold", "confidences"} <= set(iterations.columns)
    assert (iterations["models"] == TINY).all()
    assert len(tokens) == 3 * N_TOKENS
    for spec in summary["lane"]:
        assert _token_count(final[1], spec) >= 1


def test_figures_have_a_slower_cadence_than_text(pair):
    updates = list(ui.compare(pair, "abc", max_new_tokens=N_TOKENS, interval=0.0, plot_interval=3600.0))
    running = updates[1:-1]
    assert len(running) >= 2
    assert isinstance(running[0][2], go.Figure)  # the first running update draws
    assert all(isinstance(f, dict) and f.get("__type__") == "update" for u in running[1:] for f in u[2:7])
    assert all(isinstance(f, go.Figure) for f in updates[-1][2:6])  # the final update always draws


def test_stop_ends_the_run_with_the_partial_trace(pair):
    """Stop pressed while the page shows an update: the run ends with "Stopped", nothing runs after the request
    is seen, and the lanes, summary and CSVs keep every iteration completed until then (nothing is lost)."""
    stop = threading.Event()
    run = ui.compare(pair, "Once upon a time", max_new_tokens=64, interval=0.0, plot_interval=0.0,
                     should_stop=stop.is_set)
    updates = []
    for update in run:
        updates.append(update)
        if len(updates) == 4:  # the "Starting" update and three running ones
            stop.set()
    *_, shown, final = updates
    assert "Running" in shown[0]
    assert "Stopped" in final[0] and "Done" not in final[0]
    summary = final[ui.OUTPUT_LABELS.index("summary")]
    assert summary.equals(shown[ui.OUTPUT_LABELS.index("summary")])  # exactly where the page was when Stop was pressed
    assert (summary["new tokens"] < 64).all()
    iterations = pd.read_csv(final[ui.OUTPUT_LABELS.index("iterations_csv")])
    tokens = pd.read_csv(final[ui.OUTPUT_LABELS.index("tokens_csv")])
    assert set(iterations["strategy"]) == {"autoregressive", "static:5", "threshold:0.4:20"}
    for lane in summary["lane"]:
        made = int(summary.loc[summary["lane"] == lane, "new tokens"].iloc[0])
        assert (tokens["strategy"] == lane).sum() == made
        assert iterations.loc[iterations["strategy"] == lane, "emitted"].sum() == made
        assert _token_count(final[1], lane) == made


def test_stop_before_the_first_iteration_ends_cleanly(pair):
    *_, final = ui.compare(pair, "abc", lane_b="oracle", max_new_tokens=32, should_stop=lambda: True)
    assert "Stopped" in final[0] and all(final[i] is None for i in (8, 9, 10))


def test_stop_signals_are_per_session_and_rearmed_by_run():
    stops = session.StopSignals()
    mine, theirs = stops.checker("a"), stops.checker("b")
    assert not mine() and not theirs()
    assert stops.request("a") is False  # nothing queued or running: nothing to report
    stops.arm("a")  # Run pressed: an earlier Stop does not cancel the new run
    assert not mine()
    assert stops.request("a") is True and mine() and not theirs()
    stops.done("a")
    assert stops.request("a") is False
    stops.arm(None)  # no session (an API client without one): its own slot
    assert stops.request(None) is True and stops.checker(None)() and not theirs()


class _Request:
    def __init__(self, session):
        self.session_hash = session


def test_a_stop_with_nothing_running_cannot_end_a_later_run():
    stops = session.StopSignals()
    # Stop pressed in an idle session: a no-op, so the next run in that session (browser or API) runs
    assert stops.request("idle") is False and not stops.checker("idle")()
    assert not stops.for_request(_Request("idle"))()
    # a run reached straight through the API (no Run click to arm it) starts clear even if a stale signal is set
    stops.arm("api")
    stops.request("api")
    stops.done("api")
    assert stops.checker("api")()  # left over from the ended run
    assert not stops.for_request(_Request("api"))()
    # a browser run armed by Run keeps a Stop pressed while it was queued
    stops.arm("browser")
    stops.request("browser")
    assert stops.for_request(_Request("browser"))()


def test_bad_input_becomes_gr_error(pair):
    cases = [
        dict(prompt="   "),                                       # empty prompt
        dict(prompt="x" * 1100),                                  # longer than the tiny context (1024)
        dict(prompt="hello", max_new_tokens=1020),                # prompt + new tokens over the context
        dict(prompt="hello", max_new_tokens=0),
        dict(prompt="hello", k=0),                                # static:0
        dict(prompt="hello", lane_b="threshold", threshold=1.5),  # tau out of range
        dict(prompt="hello", lane_a="warp-drive"),                # unknown policy
        dict(prompt="hello", lane_a="oracle", sample=True),       # oracle needs greedy
        dict(prompt="hello", sample=True, temperature=0),
        dict(prompt="hello", seed="abc"),
    ]
    for kwargs in cases:
        with pytest.raises(gr.Error) as info:
            list(ui.compare(pair, **kwargs))
        assert info.value.message and "\n" not in info.value.message, kwargs


def test_extreme_sliders_run(pair):
    """Threshold 0 (never stops on confidence) and 1 (stops after every draft), K and KMAX at their bounds."""
    *_, final = ui.compare(pair, "abc", lane_a="static", lane_b="threshold", k=32, threshold=0.0, max_lookahead=1,
                           max_new_tokens=4, baseline=False, chat=False, interval=0.0)
    assert list(final[ui.OUTPUT_LABELS.index("summary")]["lane"]) == ["static:32", "threshold:0:1"]
    *_, final = ui.compare(pair, "abc", lane_a="static", lane_b="threshold", k=1, threshold=1.0, max_lookahead=32,
                           max_new_tokens=4, interval=0.0, sample=True, seed=3)
    assert "Done" in final[0]


def test_loader_failure_is_reported():
    loader = loader_mod.ModelLoader("/nonexistent/target::/nonexistent/assistant").start()
    with pytest.raises(Exception):
        loader.get(timeout=60)
    assert loader.status().startswith("✗")
    with pytest.raises(gr.Error, match="could not be loaded"):
        list(ui.compare(loader.get, "hello"))


def test_loader_poll_draws_the_machine_tab():
    """The page's timer: the status line and the This-machine tab's text and two figures (drawn before any profile
    exists, and again only when the text changes)."""
    loader = loader_mod.ModelLoader("tiny", profile=False)
    status, md, cost, speedup, timer = loader.poll()
    assert isinstance(status, str) and isinstance(md, str)
    assert isinstance(cost, go.Figure) and isinstance(speedup, go.Figure)
    again = loader.poll(shown_status=status, shown_machine=md)
    assert all(isinstance(x, type(gr.skip())) for x in again[1:4])


# ------------------------------------------------------------------------------------------------
# lanes HTML


def test_lanes_html_escapes_and_colours_tokens():
    tokens = pd.DataFrame([
        ("static:5", 0, 10, "<script>alert(1)</script>", SOURCE_DRAFT, 0.9, 1),
        ("static:5", 1, 11, '" onmouseover="x', SOURCE_CORRECTION, float("nan"), 1),
        ("static:5", 2, 12, "&amp;\n", SOURCE_BONUS, float("nan"), 2),
    ], columns=["strategy", "position", "token_id", "text", "source", "draft_prob", "iteration"])
    page = lanes.lanes_html([parse_strategy("static:5")], tokens, None)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert '" onmouseover' not in page
    assert "&amp;amp;" in page
    assert 'class="t-accepted_draft"' in page and 'class="t-target_correction"' in page
    assert "draft p = 0.900" in page


def test_split_characters_are_joined(pair):
    """A character split over byte-level tokens shows once, decoded together, not as two U+FFFD."""
    tokens = pd.DataFrame([
        ("static:5", 0, 1, "\ufffd", SOURCE_DRAFT, 0.9, 1),
        ("static:5", 1, 2, "\ufffd", SOURCE_DRAFT, 0.8, 1),
        ("static:5", 2, 3, "!", SOURCE_BONUS, float("nan"), 1),
    ], columns=["strategy", "position", "token_id", "text", "source", "draft_prob", "iteration"])
    page = lanes.lanes_html([parse_strategy("static:5")], tokens, None, decode=lambda ids: "é" if ids == [1, 2] else "\ufffd")
    assert "é" in page and "\ufffd" not in page and page.count('<span class="t-') == 2


# ------------------------------------------------------------------------------------------------
# plots (pure functions of the trace, also from a CSV)


def test_plots_from_trace_and_csv(snapshot, tmp_path):
    frame = snapshot.iterations()
    path = tmp_path / "trace.csv"
    snapshot.export_iterations().to_csv(path, index=False)
    for source in (frame, pd.read_csv(path)):
        race, lookahead, latency, confidence, positions = plots.all_figures(source, snapshot.strategies)
        assert [t.line.color for t in race.data] == [plots.strategy_color(s) for s in snapshot.strategies]
        assert race.layout.xaxis.title.text and race.layout.yaxis.title.text
        # autoregressive has no drafts: two drafting panels; latency shows all three lanes
        panels = {a.text for a in lookahead.layout.annotations}
        assert panels == {"<b>static:4</b>", "<b>threshold:0.4:12</b>"}
        assert {t.name for t in lookahead.data} >= {"drafted", "accepted", "K in force"}
        assert len({t.yaxis for t in latency.data}) == 3
        taus = [s.y0 for s in confidence.layout.shapes]
        assert taus and set(taus) == {0.4}
        # acceptance by draft position: one line per drafting lane, its first point every drafting iteration
        assert [t.name for t in positions.data] == ["static:4", "threshold:0.4:12"]
        for t in positions.data:
            lane = source[(source["strategy"] == t.name) & (source["lookahead"] > 0)]
            assert t.x[0] == 1 and t.customdata[0][1] == len(lane)
            assert t.customdata[0][0] == (lane["accepted"] >= 1).sum()
        drafted = sum(len(plots.confidence_points(source, s)) for s in ("static:4", "threshold:0.4:12"))
        assert drafted == int(frame["lookahead"].sum())


def test_plot_placeholders_and_colours():
    empty = pd.DataFrame(columns=["strategy"])
    for fig in plots.all_figures(empty):
        assert isinstance(fig, go.Figure) and not fig.data and fig.layout.annotations
    assert plots.strategy_color("static:5") == plots.KIND_COLORS["static"]
    nine = plots.strategy_color("static:9")  # a shade of the static hue: stable, distinct from K=5 and from thresholds
    assert re.fullmatch(r"#[0-9a-f]{6}", nine) and nine == plots.strategy_color("static:9")
    assert nine != plots.strategy_color("static:5") and nine != plots.strategy_color("threshold:0.1")
    assert re.fullmatch(r"#[0-9a-f]{6}", plots.strategy_color("brand-new-kind:3"))


def test_the_idle_app_polls_gradio_queue_slowly():
    """Gradio's queue checks for work every 1 ms when idle; app.quiet_queue slows it to 50 ms (idle CPU)."""
    import app

    demo = app.quiet_queue(app.build_demo("tiny").queue(default_concurrency_limit=1))
    assert demo._queue.sleep_when_free == app.IDLE_POLL_S
    assert demo._queue.progress_update_sleep_when_free == 2 * app.IDLE_POLL_S
    demo.close()


def test_the_sweeps_default_grid_fits_its_settings_limit_and_hybrids_fit_when_ticked():
    from disco.app import sweep_tab
    from disco.limits import Budgets

    limit = Budgets().sweep_settings
    defaults = (sweep_tab.DEFAULT_STATIC, sweep_tab.DEFAULT_TAUS, sweep_tab.DEFAULT_KMAXES, True, True)
    assert len(sweep_tab.grid_policies(*defaults, rules=sweep_tab.default_rules())) <= limit
    assert "hybrid" not in sweep_tab.default_rules() and "hybrid" in sweep_tab.RULE_CHOICES
    assert len(sweep_tab.grid_policies(*defaults, rules=["hybrid"])) <= limit
