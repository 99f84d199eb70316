"""Every bad input is one clear line, never a traceback, and the next valid run works (issue: safe to host).

A table through the command line (exit code 2, one stderr line) and one through the app's public endpoints with
gradio_client (``/compare`` raises one line; ``/sweep`` answers "⚠ ..." in its status)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disco.cli import main
from disco.app.race_tab import OUTPUT_LABELS

ITERATIONS_CSV, TOKENS_CSV, SUMMARY = (OUTPUT_LABELS.index(n) for n in ("iterations_csv", "tokens_csv", "summary"))

ROOT = Path(__file__).resolve().parents[2]
SURROGATE = "abc\udcff def"  # what Python makes of invalid UTF-8 bytes in argv (surrogateescape)

CLI_CASES = [
    # generate: the prompt
    (["generate", "--prompt", ""], "prompt is empty"),
    (["generate", "--prompt", " \t\n "], "prompt is empty"),
    (["generate", "--prompt", SURROGATE], "not valid text"),
    (["generate", "--prompt", "x" * 100_001], "characters"),
    (["generate", "--prompt-file", "/no/such/prompt.txt"], "cannot read prompt file"),
    (["generate", "--prompt-file", "/"], "cannot read prompt file"),
    (["generate"], "give a prompt"),
    # generate: numbers
    (["generate", "--prompt", "x", "--seed", str(2**70)], "seed must be between"),
    (["generate", "--prompt", "x", "--seed", "-1"], "seed must be between"),
    (["generate", "--prompt", "x", "--seed", "abc"], "integer"),
    (["generate", "--prompt", "x", "--seed", "1.5"], "integer"),
    (["generate", "--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "--prompt", "x", "--max-new-tokens", "99999999"], "max_new_tokens"),
    (["generate", "--prompt", "x", "--max-new-tokens", "abc"], "integer"),
    (["generate", "--prompt", "x", "--sample", "--temperature", "0"], "temperature"),
    (["generate", "--prompt", "x", "--sample", "--temperature", "-1"], "temperature"),
    (["generate", "--prompt", "x", "--sample", "--temperature", "nan"], "temperature"),
    (["generate", "--prompt", "x", "--sample", "--top-p", "0"], "top_p"),
    (["generate", "--prompt", "x", "--sample", "--top-p", "1.5"], "top_p"),
    (["generate", "--prompt", "x", "--temperature", "warm"], "number"),
    # generate: strategies
    (["generate", "--prompt", "x", "--strategy", "static:0"], "K"),
    (["generate", "--prompt", "x", "--strategy", "static:5000"], "between 1 and 128"),
    (["generate", "--prompt", "x", "--strategy", "threshold:1.5:20"], "threshold"),
    (["generate", "--prompt", "x", "--strategy", "threshold:nan:20"], "threshold"),
    (["generate", "--prompt", "x", "--strategy", "threshold:0.4:0"], "KMAX"),
    (["generate", "--prompt", "x", "--strategy", "warp-drive"], "unknown strategy"),
    (["generate", "--prompt", "x", "--strategy", ""], "strategy"),
    (["generate", "--prompt", "x", "--strategy", "static:3", "--strategy", "static:3"], "listed twice"),
    (["generate", "--prompt", "x", "--strategy", "static:3@fp8"], "assistant precision"),
    (["generate", "--prompt", "x", "--strategy", "oracle", "--sample"], "greedy"),
    # generate: files and models
    (["generate", "--prompt", "x", "--csv", "/tmp"], "it is a folder"),
    (["generate", "--prompt", "x", "--tokens-csv", "/tmp"], "it is a folder"),
    (["generate", "--prompt", "x", "--csv", "/no/such/dir/t.csv"], "does not exist"),
    (["generate", "--prompt", "x", "--dtype", "fp16"], "invalid choice"),
    (["generate", "--prompt", "x", "--assistant-precision", "fp8"], "invalid choice"),
    (["generate", "--prompt", "x", "--models", "nonsense"], "unknown models"),
    (["generate", "--prompt", "x", "--frobnicate"], "unrecognized arguments"),
    # bench
    (["bench", "--prompts", "no-such-prompt"], "no-such-prompt"),
    (["bench", "--max-new-tokens", "0"], "max-new-tokens"),
    (["bench", "--taus", "2"], "--taus"),
    (["bench", "--kmaxes", "0"], "KMAX"),
    (["bench", "--static-ks", "abc"], "static"),
    (["bench", "--cost-profile", "flat:x"], "C must be a number"),
    (["bench", "--cost-profile", "gpu"], "unknown cost profile"),
    (["bench", "--mode", "fast"], "invalid choice"),
    # profile
    (["profile", "--reps", "0"], "--reps"),
    (["profile", "--prompts", "nope"], "unknown suite prompt"),
    (["profile", "--csv", "/tmp"], "it is a folder"),
    (["profile", "--max-new-tokens", "0"], "--max-new-tokens"),
    # top level
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize("argv,needle", CLI_CASES, ids=[f"cli{i}" for i in range(len(CLI_CASES))])
def test_cli_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # bench writes nothing on refusal; keep any stray output out of the repo
    if argv[0] in ("generate", "bench", "profile") and "--models" not in argv:
        argv = [argv[0], "--models", "tiny", *argv[1:]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(("disco: error:", "disco bench: error:")), lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


def test_cli_table_has_at_least_45_cases_and_a_valid_run_follows(capsys):
    assert len(CLI_CASES) >= 45
    assert main(["generate", "--models", "tiny", "--prompt", "def f(x):", "--max-new-tokens", "6", "--seed",
                 str(2**63 - 1), "--json"]) == 0


def test_invalid_utf8_bytes_in_argv_are_one_line_in_a_real_process():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable.encode(), b"-m", b"disco", b"generate", b"--models", b"tiny", b"--prompt",
                           b"caf\xff\xfe"], capture_output=True, cwd=ROOT, env=env, timeout=300)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "not valid text" in err, err
    proc = subprocess.run([sys.executable, "-m", "disco", "generate", "--models", "tiny", "--prompt", "x", "--seed",
                           str(2**70)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "seed must be between" in proc.stderr


# ---------------------------------------------------------------------------------------------
# the app's endpoints

COMPARE_CASES = [
    (dict(prompt=""), "prompt is empty"),
    (dict(prompt="   "), "prompt is empty"),
    (dict(prompt="x" * 5000), "context"),
    (dict(prompt="abc", k="abc"), "must be a number"),
    (dict(prompt="abc", k=0), "between 1 and 128"),
    (dict(prompt="abc", k=1000), "between 1 and 128"),
    (dict(prompt="abc", k=100), "limit of 32"),
    (dict(prompt="abc", k=2.5), "whole number"),
    (dict(prompt="abc", lane_b="threshold", threshold=2), "threshold"),
    (dict(prompt="abc", lane_b="threshold", threshold="nan"), "finite"),
    (dict(prompt="abc", lane_b="threshold", max_lookahead=0), "KMAX"),
    (dict(prompt="abc", max_new_tokens=0), "max_new_tokens"),
    (dict(prompt="abc", max_new_tokens=100000), "max_new_tokens"),
    (dict(prompt="abc", max_new_tokens=600), "limit of 512"),
    (dict(prompt="abc", seed=-1), ""),
    (dict(prompt="abc", seed=2**64), "seed must be between"),
    (dict(prompt="abc", seed="abc"), ""),
    (dict(prompt="abc", lane_a="static:128"), "limit of 32"),
    (dict(prompt="abc", lane_b="threshold:0:128"), "limit of 32"),
    (dict(prompt="abc", lane_a="static:5000"), "between 1 and 128"),
    (dict(prompt="abc", lane_a="warp-drive"), "unknown"),
    (dict(prompt="abc", lane_a=""), "no policy"),
    (dict(prompt="abc", lane_a_assistant="fp8"), ""),
    (dict(prompt="abc", lane_a="static:3@fp8"), "assistant precision"),
    (dict(prompt="abc", lane_b="threshold:1.5:5"), "threshold"),
    (dict(prompt="abc", sample=True, temperature=0), "temperature"),
    (dict(prompt="abc", sample=True, top_p=0), "top_p"),
    (dict(prompt="abc", sample=True, temperature="hot"), "must be a number"),
    (dict(prompt="abc", lane_a="oracle", sample=True), "greedy"),
]

SWEEP_CASES = [
    (dict(static_ks="abc"), "static K"),
    (dict(taus="2"), "outside"),
    (dict(kmaxes="0"), "outside"),
    (dict(kmaxes="100"), "outside"),
    (dict(taus=""), "at least one"),
    (dict(taus=",".join(f"{i / 1000:.3f}" for i in range(300))), "settings"),
    (dict(taus="0.1," * 2000), "too long"),
    (dict(prompt_ids=[]), "at least one prompt"),
    (dict(prompt_ids=["no-such-prompt"]), "unknown prompt 'no-such-prompt'"),  # raw inputs: checked by the tab itself
    (dict(max_new=100000), "max new tokens must be between 8 and 256"),
    (dict(profile="gpu"), "unknown cost profile"),
    (dict(profile="flat:-1"), "C must be in"),
    (dict(profile="../../etc/passwd.csv"), "upload a CSV"),
]


@pytest.fixture(scope="module")
def client(serve_app, tmp_path_factory):
    from gradio_client import Client

    import app

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISCO_CACHE", str(tmp_path_factory.mktemp("replay")))
        with serve_app(app.build_demo("tiny"), **app.launch_kwargs()) as url:
            yield Client(url, verbose=False), url


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    assert text and "Traceback" not in text and len(text.splitlines()) == 1, text
    return text


def test_compare_bad_inputs_are_one_line_errors_and_the_app_stays_ready(client):
    client, _ = client
    assert len(COMPARE_CASES) + len(SWEEP_CASES) >= 35
    failures = []
    for kwargs, needle in COMPARE_CASES:
        try:
            client.predict(**{"max_new_tokens": 4, **kwargs}, api_name="/compare")
        except Exception as exc:  # noqa: BLE001 - gradio_client raises its own AppError
            text = _one_line(exc)
            if needle and needle not in text:
                failures.append((kwargs, text))
            if "has raised an exception" in text:  # Gradio's generic message: the input was not checked by us
                failures.append((kwargs, text))
        else:
            failures.append((kwargs, "accepted"))
    assert not failures, "\n".join(map(repr, failures))
    # a seed at the top of the range is valid and exact (no float detour)
    result = client.predict("def f(x):", max_new_tokens=6, sample=True, seed=2**63 - 1, api_name="/compare")
    assert "Done" in result[0]


def _sweep(client, prompt_ids=("code-complete-fib",), static_ks="1,3", taus="0.4", kmaxes="4", max_new=8,
           profile="measured"):
    return client.predict(list(prompt_ids), static_ks, taus, kmaxes, False, False, max_new, profile, None,
                          api_name="/sweep")


def test_sweep_bad_inputs_are_one_line_warnings_and_the_next_sweep_works(client):
    client, _ = client
    failures = []
    for kwargs, needle in SWEEP_CASES:
        try:
            status = _sweep(client, **kwargs)[0]
        except Exception as exc:  # noqa: BLE001 - e.g. Gradio's own slider bounds
            status = "⚠ " + _one_line(exc)
        if not status.startswith("⚠") or needle not in status or "\n" in status.strip():
            failures.append((kwargs, status))
    assert not failures, "\n".join(map(repr, failures))
    assert "1/1 prompts replayed" in _sweep(client)[0]


def test_a_run_over_the_time_budget_stops_with_its_partial_trace(monkeypatch, serve_app):
    """DISCO_RUN_BUDGET_S ends a long run like Stop does, says why, and keeps what completed."""
    import pandas as pd
    from gradio_client import Client

    import app
    from disco import limits

    real = limits.Deadline

    def polled(seconds, clock=None):  # the budget in polls of the stop check, not seconds: the run ends at the
        ticks = itertools.count()     # same place on any machine, after some iterations and long before its end
        return real(seconds, clock=lambda: float(next(ticks)))

    monkeypatch.setattr(limits, "Deadline", polled)
    monkeypatch.setenv("DISCO_RUN_BUDGET_S", "400")  # 400 polls
    with serve_app(app.build_demo("tiny")) as url:
        client = Client(url, verbose=False)
        result = client.predict("Once upon a time", lane_a="static:32", lane_b="threshold:0:32", max_lookahead=32,
                                max_new_tokens=512, api_name="/compare")
    assert "Stopped" in result[0] and "time budget of 400 s" in result[0]
    trace = pd.read_csv(result[ITERATIONS_CSV])  # some iterations completed: their trace is kept
    assert not trace.empty and (trace.groupby("strategy")["new_tokens"].max() < 512).all()


def _raw_call(url: str, endpoint: str, data: list) -> str:
    """POST to Gradio's HTTP API as any client could (JSON escapes allow what gradio_client cannot send, such
    as a lone surrogate) and return the event stream's text."""
    import httpx

    body = json.dumps({"data": data})  # ensure_ascii: "\\udcff" travels as an escape
    with httpx.Client(timeout=120) as http:
        event = http.post(f"{url}gradio_api/call/{endpoint}", content=body,
                          headers={"Content-Type": "application/json"}).json()["event_id"]
        return http.get(f"{url}gradio_api/call/{endpoint}/{event}").text


def test_raw_http_inputs_gradio_client_cannot_send(client):
    _, url = client
    full = ["abc", "static", "threshold", 5, 0.4, 20, 4, True, False, False, 1.0, 1.0, 0, "default", "default",
            "default"]
    stream = _raw_call(url, "compare", [SURROGATE, *full[1:]])
    assert "event: error" in stream and "not valid text" in stream and "Traceback" not in stream, stream
    stream = _raw_call(url, "compare", [*full[:12], None, *full[13:]])
    assert "event: complete" in stream, stream  # a null seed is the default seed
    stream = _raw_call(url, "compare", [*full[:12], "NaN", *full[13:]])
    assert "event: error" in stream and "seed must be a whole number" in stream, stream
    stream = _raw_call(url, "compare", [*full[:15], "vulkan"])
    assert "event: error" in stream and "unknown engine" in stream and "Traceback" not in stream, stream
    stream = _raw_call(url, "compare", [*full[:12], str(2**63 - 1), *full[13:]])
    assert "event: complete" in stream, stream  # the top of the range, exact
    stream = _raw_call(url, "compare", [{"not": "text"}, *full[1:]])
    assert "event: error" in stream and "Traceback" not in stream, stream


def test_operator_limits_shape_the_sliders_and_the_typed_specs(monkeypatch, serve_app):
    from gradio_client import Client

    import app

    monkeypatch.setenv("DISCO_MAX_LOOKAHEAD", "8")
    monkeypatch.setenv("DISCO_MAX_NEW_TOKENS", "16")
    demo = app.build_demo("tiny")
    sliders = {c.elem_id: c for c in demo.blocks.values() if getattr(c, "elem_id", None) in ("k", "max-lookahead",
                                                                                             "max-new-tokens")}
    assert sliders["k"].maximum == 8 and sliders["max-lookahead"].maximum == 8
    assert sliders["max-new-tokens"].maximum == 16 and sliders["max-new-tokens"].value == 16
    with serve_app(demo, **app.launch_kwargs()) as url:
        client = Client(url, verbose=False)
        with pytest.raises(Exception, match="limit of 8"):
            client.predict("abc", lane_a="static:9", max_new_tokens=4, api_name="/compare")
        with pytest.raises(Exception, match="limit of 16"):
            client.predict("abc", max_new_tokens=17, api_name="/compare")
        with pytest.raises(Exception, match="DISCO_RUN_BUDGET_S"):
            monkeypatch.setenv("DISCO_RUN_BUDGET_S", "soon")
            client.predict("abc", max_new_tokens=4, api_name="/compare")
