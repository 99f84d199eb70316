"""The sampling study (``python -m disco sampling``): its costing is replay's, its summary is recomputed from its
rows, and the command runs end to end on the tiny pair with clear errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from disco.bench.sampling import modelled_ms, speedups, summary
from disco.costs.model import CostModel
from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.models import encode_prompt
from disco.policies import parse_strategy
from disco.replay.run import replay
from disco.replay.tables import build_table

COSTS = CostModel(target=[(1, 100.0), (2, 104.0), (4, 112.0), (16, 160.0), (64, 400.0)],
                  assistant=[(1, 8.0), (2, 8.5), (64, 40.0)])


@pytest.mark.parametrize("spec", ["static:4", "threshold:0.4:20", "lookup:8", "autoregressive", "heuristic:3"])
def test_a_greedy_runs_modelled_time_is_replays(tiny_pair, spec):
    """The study costs a live run's own records the way replay costs the same iterations, to the float."""
    ids = encode_prompt(tiny_pair, "def add(a, b):", False, 24)
    live = Decoder(tiny_pair, ids, parse_strategy(spec), DecodeSettings(max_new_tokens=24)).run()
    rep = replay(build_table(tiny_pair, ids, 24), parse_strategy(spec), 24, COSTS)
    assert modelled_ms(live.records, COSTS) == pytest.approx(rep.records[-1].elapsed_ms, rel=1e-12)


def test_speedups_and_summary_from_hand_made_rows():
    rows = pd.DataFrame([
        # prompt, temperature, seed, strategy, new tokens, ms
        ("p", 1.0, 0, "autoregressive", 10, 1000.0), ("p", 1.0, 0, "static:2", 10, 500.0),
        ("p", 1.0, 1, "autoregressive", 8, 800.0), ("p", 1.0, 1, "static:2", 10, 625.0),
        ("q", 1.0, 0, "autoregressive", 10, 1000.0), ("q", 1.0, 0, "static:2", 10, 2000.0),
        ("q", 1.0, 1, "autoregressive", 10, 1000.0), ("q", 1.0, 1, "static:2", 10, 1000.0),
    ], columns=["prompt_id", "temperature", "seed", "strategy", "new_tokens", "ms_measured"])
    rows["accepted"], rows["drafted"] = 1, 2
    sp = speedups(rows, "measured").set_index(["prompt_id", "seed"])["speedup"]
    assert sp[("p", 0)] == pytest.approx(2.0) and sp[("p", 1)] == pytest.approx(100 / 62.5)  # per token
    assert sp[("q", 0)] == pytest.approx(0.5) and sp[("q", 1)] == pytest.approx(1.0)
    table = summary(rows, ["measured"]).iloc[0]
    seed0, seed1 = (2.0 * 0.5) ** 0.5, (1.6 * 1.0) ** 0.5  # geomean over prompts per seed
    assert table["speedup_mean"] == pytest.approx((seed0 + seed1) / 2)
    assert table["speedup_min"] == pytest.approx(seed0) and table["speedup_max"] == pytest.approx(seed1)
    assert table["of_best"] == 1.0 and table["seeds"] == 2 and table["acceptance"] == 0.5


def test_the_command_end_to_end_on_the_tiny_pair(tmp_path):
    out = tmp_path / "sampling"
    argv = [sys.executable, "-m", "disco", "sampling", "--models", "tiny", "--prompts", "code-csv-parse,code-binary-search",
            "--strategies", "static:3,threshold:0.4:20,costaware:8", "--temperatures", "0.7,1", "--seeds", "2",
            "--max-new-tokens", "12", "--cost-profile", "flat:0.05", "--out", str(out), "--no-progress"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_csv(out / "sampling.csv")
    assert set(rows["strategy"]) == {"autoregressive", "static:3", "threshold:0.4:20", "costaware:8"}  # costs read
    assert set(rows["prompt_id"]) == {"code-binary-search"}  # the test split only
    assert len(rows) == 1 * 2 * 2 * 4 and (rows["ms_measured"] > 0).all() and (rows["ms_flat:0.05"] > 0).all()
    ar = rows[rows["strategy"] == "autoregressive"]
    assert (ar["iterations"] == ar["new_tokens"]).all() and (ar["assistant_passes"] == 0).all()
    table = pd.read_csv(out / "sampling_summary.csv")
    assert set(table["cost"]) == {"measured", "flat:0.05", "wall"}
    recomputed = summary(rows, ["measured", "flat:0.05", "wall"])
    pd.testing.assert_frame_equal(table.reset_index(drop=True), recomputed.reset_index(drop=True), check_dtype=False)
    md = (out / "sampling.md").read_text()
    assert "threshold:0.4:20` (the seed's)" in md and "T = 0.7" in md and "flat:0.05" in md
    assert "T=0.7: best" in proc.stdout and "T=1: best" in proc.stdout


@pytest.mark.parametrize("argv,needle", [
    (["--temperatures", "0"], "--temperatures"),
    (["--top-p", "1.5"], "--top-p"),
    (["--strategies", "oracle"], "greedy"),
    (["--strategies", "autoregressive"], "at least one setting that drafts"),
    (["--strategies", "static:x"], "must be an integer"),
    (["--cost-profile", "measured"], "flat:C"),
    (["--prompts", "nope"], "unknown prompt"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "disco", "sampling", "--models", "tiny", "--out", str(tmp_path / "o"),
                           "--no-progress", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_output_folder_that_is_a_file_is_refused_before_any_work(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    proc = subprocess.run([sys.executable, "-m", "disco", "sampling", "--models", "tiny", "--out", str(taken),
                           "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "it is a file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_without_strategies_the_settings_come_from_train_replay_per_cost_profile(tmp_path):
    """The settings sampled are those greedy replay ranks best on the train prompts under each cost profile (read
    back from the same cached tables), plus the seed's setting."""
    out, tables = tmp_path / "sampling", tmp_path / "tables"
    argv = [sys.executable, "-m", "disco", "sampling", "--models", "tiny", "--prompts", "code-csv-parse,code-binary-search",
            "--temperatures", "1", "--seeds", "1", "--max-new-tokens", "10", "--cost-profile", "flat:0.05",
            "--cache-dir", str(tables), "--out", str(out), "--no-progress"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    meta = __import__("json").loads((out / "meta.json").read_text())
    assert set(meta["chosen_by_cost"]) == {"measured", "flat:0.05"}
    for specs in meta["chosen_by_cost"].values():
        assert specs and all(s.startswith(("static:", "threshold:")) for s in specs)
    assert "threshold:0.4:20" in meta["chosen"]
    assert set(pd.read_csv(out / "sampling.csv")["strategy"]) == {"autoregressive", *meta["chosen"]}
    assert [p.name for p in tables.iterdir()] and all(p.name.startswith("code-csv-parse") for p in tables.iterdir())
