"""The quick benchmark (tiny pair, both modes, transformers peer) end to end, and its outputs' contents."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from disco import cli


def bench_main(argv: list[str]) -> int:
    """``python -m disco bench ARGV``, in this process."""
    return cli.main(["bench", *argv])
from disco.policies import parse_strategy
from disco.policies.grids import default_grid

RUN_COLUMNS = {"prompt_id", "kind", "chat", "strategy", "mode", "implementation", "seconds", "new_tokens",
               "iterations", "target_passes", "assistant_passes", "acceptance_rate", "mean_lookahead",
               "identical_to_autoregressive", "speedup", "dtype", "device", "torch", "transformers",
               "sklearn_available", "models", "max_new_tokens"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "quick"
    code = bench_main(["--quick", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def test_quick_writes_every_output(quick):
    for name in ("runs.csv", "summary.csv", "summary.md", "heatmap.html", "heatmap.svg", "meta.json",
                 "theory.csv", "validation.csv", "peer.csv", "timed_iterations.csv", "positions.csv"):
        assert (quick / name).is_file() and (quick / name).stat().st_size > 0, name
    html = (quick / "heatmap.html").read_text()
    assert "plotly" in html.lower()
    # it opens offline: every script it loads is a file beside it (no CDN)
    sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)
    assert sources and all("//" not in src and (quick / src).is_file() for src in sources), sources
    assert (quick / "heatmap.svg").read_text().startswith("<svg")


def test_runs_csv_has_replay_grid_timed_and_peer_rows(quick):
    runs = pd.read_csv(quick / "runs.csv")
    assert RUN_COLUMNS <= set(runs.columns)
    prompts = runs["prompt_id"].unique()
    assert len(prompts) == 3 and set(runs["kind"]) >= {"code", "explanation"}
    replay = runs[runs["mode"] == "replay"]
    assert set(replay["strategy"]) == {p.spec for p in default_grid()}
    assert len(replay) == len(prompts) * len(default_grid())
    assert replay["identical_to_autoregressive"].astype(bool).all()
    timed = runs[runs["mode"] == "timed"]
    ours = timed[timed["implementation"] == "ours"]
    peer = timed[timed["implementation"] == "hf"]
    assert {"autoregressive", "threshold:0.4:20", "adaptive:0.4:20"} <= set(ours["strategy"])
    # transformers' own ROC-adapted threshold is a peer too: same text and target passes as ours (checked below)
    assert {"hf:autoregressive", "hf:threshold:0.4:20", "hf:adaptive:0.4:20"} <= set(peer["strategy"])
    assert peer["strategy"].str.startswith("hf:").all()
    # every timed strategy transformers can run has its peer (no oracle by default; copy is this project's own)
    with_peer = ours[ours["strategy"].map(lambda s: parse_strategy(s).hf_kwargs() is not None)]
    assert len(peer) == len(with_peer)
    assert {s.split(":")[0] for s in set(ours["strategy"]) - set(with_peer["strategy"])} <= {"copy"}
    assert {"lookup:10:2", "hf:lookup:10:2"} <= set(timed["strategy"])  # prompt lookup: transformers' own too
    # greedy decoding is lossless for both implementations, and both make the same target passes
    assert timed["identical_to_autoregressive"].astype(bool).all()
    assert peer["same_as_ours"].astype(bool).all()
    merged = with_peer.assign(peer="hf:" + with_peer["strategy"]).merge(
        peer, left_on=["prompt_id", "peer"], right_on=["prompt_id", "strategy"], suffixes=("", "_hf"))
    assert len(merged) == len(with_peer)
    assert (merged["target_passes"] == merged["target_passes_hf"]).all()
    assert (merged["new_tokens"] == merged["new_tokens_hf"]).all()
    assert (runs["seconds"] > 0).all()
    ar = ours[ours["strategy"] == "autoregressive"]
    assert (ar["speedup"] == 1.0).all() and (ar["target_passes"] == ar["new_tokens"]).all()
    assert (runs["sklearn_available"] == True).all()  # noqa: E712 - a dependency now (adaptive, disco)


def test_positions_csv_is_the_replayed_drafts_per_position(quick):
    """positions.csv pools every replayed draft of a strategy; its first position's counts are the runs table's
    drafting iterations and first-token acceptances (replay rows, all prompts)."""
    positions = pd.read_csv(quick / "positions.csv")
    assert {"strategy", "kind", "position", "reached", "accepted", "rate"} <= set(positions.columns)
    timed = pd.read_csv(quick / "timed_iterations.csv")
    assert (positions["accepted"] <= positions["reached"]).all()
    first = positions[(positions["kind"] == "all") & (positions["position"] == 1)].set_index("strategy")
    # the timed runs are greedy and replay is exact: the same drafts, position by position
    for spec, rows in timed[timed["lookahead"] > 0].groupby("strategy"):
        assert first.loc[spec, "reached"] == len(rows), spec
        assert first.loc[spec, "accepted"] == (rows["accepted"] >= 1).sum(), spec
    md = (quick / "summary.md").read_text()
    assert "Acceptance by draft position" in md and "`lookup:10:2`" in md


def test_validation_replay_predicts_timed_iterations_exactly(quick):
    val = pd.read_csv(quick / "validation.csv")
    assert len(val) > 0 and val["exact"].all()
    assert (val["iterations_predicted"] == val["iterations_measured"]).all()
    assert (val["target_passes_predicted"] == val["target_passes_measured"]).all()
    assert (val["assistant_passes_predicted"] == val["assistant_passes_measured"]).all()
    meta = json.loads((quick / "meta.json").read_text())
    assert meta["validation"]["counts_ok"] is True
    assert "time_error_pct_total" in meta["validation"] and meta["validation"]["tolerance_pct"] > 0


def test_summary_files(quick):
    summary = pd.read_csv(quick / "summary.csv")
    rows = summary[(summary["mode"] == "replay") & (summary["kind"] == "all")]
    assert set(rows["strategy"]) == {p.spec for p in default_grid()}
    assert (rows.set_index("strategy").loc["autoregressive", "speedup_geomean"]) == pytest.approx(1.0)
    assert {"all", "code"} <= set(summary["kind"])
    assert (summary["speedup_min"] <= summary["speedup_geomean"] + 1e-9).all()
    assert "hf:threshold:0.4:20" in set(summary["strategy"])
    md = (quick / "summary.md").read_text()
    for text in ("best static K", "threshold:0.4:20", "oracle", "Theory beside measurement", "transformers",
                 "ours / transformers", "Validation", "scikit-learn installed: yes", "heatmap.svg"):
        assert text in md, text
    theory = pd.read_csv(quick / "theory.csv")
    assert 0 < theory["alpha"].iloc[0] <= 1 and theory["c"].iloc[0] > 0
    assert theory["replay_speedup"].notna().sum() >= 10
    meta = json.loads((quick / "meta.json").read_text())
    assert meta["models"] == "tiny" and meta["sklearn_available"] is True
    assert meta["best"]["best_static"].startswith("static:") and meta["best"]["best_threshold"].startswith("threshold:")


def test_report_only_rebuilds_the_summaries_without_models(quick):
    before = (quick / "summary.md").read_text()
    (quick / "summary.md").unlink()
    (quick / "heatmap.svg").unlink()
    assert bench_main(["--report-only", "--out", str(quick)]) == 0
    after = (quick / "summary.md").read_text()
    assert (quick / "heatmap.svg").is_file()
    cut = lambda text: text.split("## Validation")[0]  # noqa: E731
    assert cut(after) == cut(before)


@pytest.mark.parametrize("argv,needle", [
    (["--quick", "--max-new-tokens", "0"], "positive"),
    (["--quick", "--strategy", "static:zero"], "static:zero"),
    (["--quick", "--prompts", "no-such-prompt"], "no-such-prompt"),
    (["--quick", "--suite", "/nonexistent/suite.json"], "suite"),
    (["--models", "nonsense", "--mode", "replay"], "nonsense"),
    (["--bogus"], "bogus"),
    (["--report-only"], "runs.csv"),
])
def test_errors_are_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    code = bench_main(argv + ["--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("disco bench: error:") and needle in err


def test_module_entry_point_runs_on_its_own():
    proc = subprocess.run([sys.executable, "-m", "disco", "bench", "--mode", "sideways"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("disco bench: error:") and len(proc.stderr.strip().splitlines()) == 1
