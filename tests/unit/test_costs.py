"""Cost profiles (disco.costs): flat:C is Leviathan's closed form, CSV profiles round-trip, bad profiles are one
line, and the benchmark re-costs cached tables under any profile without loading the models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from disco.costs import model as costs
from disco.models import encode_prompt
from disco.policies import parse_strategy
from disco.replay.run import replay
from disco.replay.tables import build_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("c", [0.0, 0.05, 0.4, 1.5])
@pytest.mark.parametrize("spec", ["autoregressive", "static:3", "threshold:0.4:20", "heuristic:2", "oracle:6"])
def test_flat_profile_is_the_closed_form_of_the_replayed_passes(tiny_pair, spec, c):
    ids = encode_prompt(tiny_pair, "def fibonacci(n):", False, 20)
    table = build_table(tiny_pair, ids, 20)
    step = 37.0
    result = replay(table, parse_strategy(spec), 20, costs.flat(c, step))
    target_passes = len(result.records)
    assistant_passes = sum(r.draft_calls for r in result.records)
    # time = T x (target passes + C x assistant passes), whatever each pass is fed (prefills included)
    assert result.summary()["seconds"] * 1000 == pytest.approx(step * (target_passes + c * assistant_passes))
    for r in result.records:
        assert r.verify_ms == pytest.approx(step) and r.draft_ms == pytest.approx(c * step * r.draft_calls)


def test_flat_profile_speedups_do_not_depend_on_the_step():
    a, b = costs.flat(0.1, 10.0), costs.flat(0.1, 500.0)
    assert a.cost_ratio == b.cost_ratio == pytest.approx(0.1)
    assert a.target_ms(33) / a.target_ms(1) == b.target_ms(33) / b.target_ms(1) == 1.0


@pytest.mark.parametrize("text,canonical", [(None, "measured"), ("", "measured"), (" measured ", "measured"),
                                            ("flat:0.05", "flat:0.05"), ("flat:.40", "flat:0.4"), ("flat:0", "flat:0")])
def test_profile_names(text, canonical):
    assert costs.check_profile(text) == canonical


@pytest.mark.parametrize("text,needle", [
    ("flat:abc", "C must be a number"), ("flat:", "C must be a number"), ("flat:-0.1", "C must be in"),
    ("flat:nan", "C must be in"), ("flat:11", "C must be in"), ("gpu", "unknown cost profile"),
    ("nowhere/costs.csv", "no such file"),
])
def test_bad_profiles_are_one_line_errors(text, needle):
    with pytest.raises(costs.CostProfileError, match=needle) as info:
        costs.check_profile(text)
    assert "\n" not in str(info.value)


def test_csv_round_trip_and_bad_csvs(tmp_path):
    rows = [{"role": "target", "precision": "bf16", "kind": "step", "tokens": n, "ms": 100 + 5 * n} for n in (1, 2, 9)]
    rows += [{"role": "target", "precision": "bf16", "kind": "prefill", "tokens": 40, "ms": 900.0}]
    rows += [{"role": "assistant", "precision": p, "kind": "step", "tokens": n, "ms": base * n}
             for p, base in (("model", 40.0), ("int8", 10.0)) for n in (1, 2)]
    path = tmp_path / "costs.csv"
    costs.write_csv(rows, path)
    assert list(pd.read_csv(path).columns) == costs.CSV_COLUMNS
    model = costs.read_csv(path, "int8")
    assert model.target_ms(9) == pytest.approx(145.0) and model.target_ms(40) == pytest.approx(900.0)
    assert model.assistant_ms(2) == pytest.approx(20.0) and model.cost_ratio == pytest.approx(10.0 / 105.0)
    assert costs.read_csv(path, "model").assistant_ms(1) == pytest.approx(40.0)
    assert costs.resolve(str(path), precision="model").assistant_ms(1) == pytest.approx(40.0)
    with pytest.raises(costs.CostProfileError, match="several assistant precisions"):
        costs.read_csv(path)
    with pytest.raises(costs.CostProfileError, match="no assistant rows for precision 'fp8'"):
        costs.read_csv(path, "fp8")
    (tmp_path / "cols.csv").write_text("role,tokens\ntarget,1\n")
    with pytest.raises(costs.CostProfileError, match="lacks column"):
        costs.read_csv(tmp_path / "cols.csv")
    (tmp_path / "neg.csv").write_text("role,precision,kind,tokens,ms\ntarget,bf16,step,1,-3\nassistant,model,step,1,1\n")
    with pytest.raises(costs.CostProfileError, match="ms > 0"):
        costs.read_csv(tmp_path / "neg.csv")
    (tmp_path / "only.csv").write_text("role,precision,kind,tokens,ms\ntarget,bf16,step,1,3\n")
    with pytest.raises(costs.CostProfileError, match="needs target and assistant rows"):
        costs.read_csv(tmp_path / "only.csv")


def _bench(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "disco", "bench", "--models", "tiny", "--no-progress", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_bench_recosts_cached_tables_under_a_flat_profile_without_the_models(tmp_path):
    tables = tmp_path / "tables"
    base = ["--prompts", "code-complete-fib,explain-kv-cache", "--max-new-tokens", "12", "--static-ks", "1,3",
            "--taus", "0.4", "--kmaxes", "5,20", "--cache-dir", str(tables), "--mode", "replay"]
    first = _bench(*base, "--out", str(tmp_path / "measured"))
    assert first.returncode == 0, first.stderr
    runs = pd.read_csv(tmp_path / "measured" / "runs.csv")
    flat = _bench(*base, "--out", str(tmp_path / "flat"), "--cost-profile", "flat:0.05")
    assert flat.returncode == 0, flat.stderr
    assert "models not loaded" in flat.stderr
    meta = json.loads((tmp_path / "flat" / "meta.json").read_text())
    assert meta["cost_profile"] == "flat:0.05" and meta["models_loaded"] is False
    assert "flat:0.05" in (tmp_path / "flat" / "summary.md").read_text()
    again = pd.read_csv(tmp_path / "flat" / "runs.csv")
    # same replayed iterations, new costs: time in target steps = passes + 0.05 x assistant passes
    key = ["prompt_id", "strategy"]
    merged = runs.merge(again, on=key, suffixes=("_m", "_f"))
    assert len(merged) == len(runs)
    # a cost-aware rule reads the profile, so its iterations change with it; every other rule's do not
    reads_costs = merged["strategy"].map(lambda spec: parse_strategy(spec).needs_costs
                                         or parse_strategy(spec).reads_costs)  # a hybrid: as its assistant rule
    assert reads_costs.any() and not reads_costs.all()
    same = merged[~reads_costs]
    assert (same["target_passes_m"] == same["target_passes_f"]).all()
    assert (merged["new_tokens_m"] == merged["new_tokens_f"]).all()  # greedy: the text never changes
    ar = again[again["strategy"] == "autoregressive"].set_index("prompt_id")["seconds"]
    for _, row in again.iterrows():
        step = ar[row["prompt_id"]] / runs[(runs["prompt_id"] == row["prompt_id"]) &
                                           (runs["strategy"] == "autoregressive")]["target_passes"].iloc[0]
        assert row["seconds"] == pytest.approx(step * (row["target_passes"] + 0.05 * row["assistant_passes"]), rel=1e-6)


@pytest.mark.parametrize("args,needle", [
    (["--cost-profile", "flat:x"], "C must be a number"),
    (["--cost-profile", "gpu"], "unknown cost profile"),
    (["--cost-profile", "flat:0.05", "--mode", "timed"], "--mode replay"),
    (["--cost-profile", "missing.csv"], "no such file"),
])
def test_bench_bad_cost_profiles_are_one_line_and_exit_2(args, needle, tmp_path):
    proc = _bench("--out", str(tmp_path / "o"), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
