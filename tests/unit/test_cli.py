"""The command line's contracts: --json, --csv, --tokens-csv, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from disco.costs import model as cost_profiles
from disco.cli import main
from disco.decode.trace import parse_confidences

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ["autoregressive", "static:4", "heuristic:2", "threshold:0.4:20", "threshold:0.7:6", "oracle"]
CSV_COLUMNS = ["strategy", "iteration", "lookahead", "accepted", "emitted", "stop_reason", "min_confidence",
               "threshold", "draft_ms", "verify_ms", "iteration_ms", "elapsed_ms", "new_tokens", "dtype", "device"]
REQUIRED_JSON = ["strategy", "text", "new_tokens", "seconds", "tokens_per_s", "speedup", "target_calls", "draft_calls",
                 "acceptance_rate", "mean_lookahead", "identical_to_autoregressive"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "disco", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_generate_json_and_csv_contracts(tmp_path):
    csv_path, tok_path = tmp_path / "trace.csv", tmp_path / "tokens.csv"
    args = ["generate", "--models", "tiny", "--prompt", "def add(a, b):", "--max-new-tokens", "40", "--json",
            "--csv", str(csv_path), "--tokens-csv", str(tok_path)]
    for s in STRATEGIES:
        args += ["--strategy", s]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["strategy"] for r in rows] == STRATEGIES
    for r in rows:
        assert set(REQUIRED_JSON) <= set(r)
        assert r["identical_to_autoregressive"] is True
        assert r["new_tokens"] == 40 or r["finish_reason"] == "eos"
        assert r["dtype"] == "fp32" and r["device"] == "cpu"
        assert r["engine"] == "torch" and r["kernels"] == "torch fp32"  # every row names what ran it
    assert len({r["text"] for r in rows}) == 1
    assert rows[0]["speedup"] == 1.0 and rows[0]["draft_calls"] == 0

    trace = pd.read_csv(csv_path)
    assert set(CSV_COLUMNS) <= set(trace.columns)
    assert list(trace["strategy"].unique()) == STRATEGIES  # each SPEC exactly as written
    for r in rows:
        lane = trace[trace["strategy"] == r["strategy"]]
        assert lane["emitted"].sum() == r["new_tokens"] == lane["new_tokens"].iloc[-1]
        assert len(lane) == r["target_calls"]
        assert (lane["accepted"] <= lane["lookahead"]).all()
        assert lane["elapsed_ms"].is_monotonic_increasing
        conf = lane[lane["stop_reason"] == "confidence"]
        assert (conf["min_confidence"] < conf["threshold"]).all()
        for cell, k in zip(lane["confidences"], lane["lookahead"]):
            assert len(parse_confidences(cell)) == k

    tokens = pd.read_csv(tok_path, keep_default_na=False)
    assert {"strategy", "position", "token_id", "text", "source", "draft_prob", "iteration"} <= set(tokens.columns)
    for r in rows:
        assert (tokens["strategy"] == r["strategy"]).sum() == r["new_tokens"]


def test_readable_table_without_json(capsys):
    assert main(["generate", "--models", "tiny", "--prompt", "hello world", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    for spec in ("autoregressive", "static:5", "threshold:0.4:20"):
        assert spec in out
    assert "speed-up" in out and "identical" in out


@pytest.mark.parametrize("args,needle", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "   \n"], "prompt is empty"),
    (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "x", "--max-new-tokens", "-5"], "max_new_tokens"),
    (["--prompt", "x", "--max-new-tokens", "1000000"], "max_new_tokens"),
    (["--prompt", "x", "--max-new-tokens", "ten"], "integer"),
    (["--prompt", "x", "--strategy", "threshold:1.5"], "threshold"),
    (["--prompt", "x", "--strategy", "threshold:-0.1:20"], "threshold"),
    (["--prompt", "x", "--strategy", "static:0"], "K"),
    (["--prompt", "x", "--strategy", "heuristic:-2"], "K"),
    (["--prompt", "x", "--strategy", "oracle:0"], "KMAX"),
    (["--prompt", "x", "--strategy", "banana"], "unknown strategy"),
    (["--prompt", "x", "--strategy", "static"], "unknown strategy"),
    (["--prompt", "x", "--sample", "--temperature", "0"], "temperature"),
    (["--prompt", "x", "--sample", "--strategy", "oracle"], "greedy"),
    (["--prompt", "x" * 5000], "context"),
    (["--prompt", "x" * 1000, "--max-new-tokens", "200"], "context"),
    (["--prompt-file", "/no/such/file.txt"], "cannot read prompt file"),
    (["--prompt", "x", "--csv", "/no/such/dir/t.csv"], "does not exist"),
    (["--models", "nonsense", "--prompt", "x"], "unknown models"),
    (["--models", "/no/such/target::/no/such/assistant", "--prompt", "x"], "not found"),
    ([], "prompt"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    if "--models" not in args:
        args = ["--models", "tiny", *args]
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("disco: error:") and needle in lines[0]


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_bad_input_in_a_real_process_has_no_traceback():
    """The same contract seen from outside: one stderr line, exit code 2, no traceback."""
    for args in (["generate", "--models", "tiny", "--prompt", "x", "--strategy", "threshold:2"],
                 ["generate", "--models", "tiny", "--prompt", ""],
                 ["frobnicate"]):
        proc = run_cli(*args)
        assert proc.returncode == 2
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_unknown_hub_id_offline_fails_fast_and_clearly(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["generate", "--models", "no-such-org/no-such-model::no-such-org/other", "--prompt", "x"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("disco: error: cannot load model id 'no-such-org/no-such-model'")


def test_mismatched_vocabularies_are_refused(tiny_pair):
    from disco.models import ModelLoadError
    from disco.models.load import _make_pair
    from disco.models.tiny import build_tiny_models

    target, assistant = build_tiny_models(len(tiny_pair.tokenizer))
    _, smaller = build_tiny_models(len(tiny_pair.tokenizer) - 1)
    with pytest.raises(ModelLoadError, match="output logits"):
        _make_pair("x", "t", "a", target, smaller, tiny_pair.tokenizer, tiny_pair.tokenizer, tiny_pair.dtype,
                   tiny_pair.device)

    class OtherTokenizer:
        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ModelLoadError, match="different tokenizers"):
        _make_pair("x", "t", "a", target, assistant, tiny_pair.tokenizer, OtherTokenizer(), tiny_pair.dtype,
                   tiny_pair.device)


def test_models_list_shows_every_preset(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path))  # an empty cache: embedded is installed but not prepared
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "ready" in out
    assert "embedded" in out and "models prepare" in out
    assert "TARGET::ASSISTANT" in out


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_profile_json_and_csv_then_auto_lane(tmp_path):
    env_cache = {"DISCO_CACHE": str(tmp_path / "cache")}
    env = dict(os.environ, PYTHONPATH=str(ROOT), **env_cache)
    run = lambda *a: subprocess.run([sys.executable, "-m", "disco", *a], capture_output=True, text=True, cwd=ROOT,
                                    env=env, timeout=300)
    # no profile yet: `auto` is refused in one line, before any decoding
    proc = run("generate", "--models", "tiny", "--prompt", "def f(x):", "--strategy", "auto", "--max-new-tokens", "8")
    assert proc.returncode == 2 and "python -m disco profile" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    csv_path = tmp_path / "costs.csv"
    proc = run("profile", "--models", "tiny", "--prompts", "code-complete-fib", "--max-new-tokens", "10", "--reps", "1",
               "--json", "--csv", str(csv_path))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["recommended"]["auto"] and "flags" in data["key"]
    costs = pd.read_csv(csv_path)
    assert list(costs.columns) == ["role", "precision", "kind", "tokens", "ms"]
    # the CSV is a cost profile replay can read back: the same per-pass costs, for each assistant precision
    for precision, steps in data["assistant_ms"].items():
        model = cost_profiles.read_csv(csv_path, precision)
        for n, ms in data["target_ms"].items():
            assert model.target_ms(int(n)) == pytest.approx(ms)
        for n, ms in steps.items():
            assert model.assistant_ms(int(n)) == pytest.approx(ms)
    proc = run("profile", "--models", "tiny", "--prompts", "code-complete-fib", "--max-new-tokens", "10")
    assert proc.returncode == 0 and "recommended (the `auto` lane)" in proc.stdout and "machine:" in proc.stdout
    proc = run("generate", "--models", "tiny", "--prompt", "def f(x):", "--strategy", "autoregressive", "--strategy",
               "auto", "--max-new-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    if data["recommended"]["auto"] == "autoregressive":  # speculation does not pay: the target alone, run once
        assert [r["strategy"] for r in rows] == ["autoregressive"]
    else:
        assert rows[1]["strategy"] == data["recommended"]["auto"] and rows[1]["identical_to_autoregressive"] is True


@pytest.mark.parametrize("args,message", [
    (["profile", "--models", "tiny", "--prompts", "nope"], "unknown suite prompt"),
    (["profile", "--models", "tiny", "--reps", "0"], "--reps"),
    (["profile", "--models", "tiny", "--variants"], "--variants goes with --kernels"),
    (["generate", "--models", "tiny", "--prompt", "x", "--assistant-precision", "fp8"], "invalid choice"),
    (["generate", "--models", "tiny", "--prompt", "x", "--strategy", "static:3@fp8"], "assistant precision"),
])
def test_numerics_bad_input_is_one_line(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
