"""The engine chosen by measurement (issue 27): from both engines' profiles, the faster one for a typical run and why,
from which prompt length the other wins, kept per machine for ``--engine auto``; the This-machine tab shows both;
every ``generate --json`` row names the engine and the kernels that ran it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from disco.app import machine_tab
from disco.costs import engines
from disco.costs import profile as profiles
from disco.costs.profile import Profile
from disco.models import engine_choice, load as model_load

ROOT = Path(__file__).resolve().parents[2]


def make_profile(engine: str, step: float, speedup: float, prefill_ms: float, prefill_tokens: int = 200,
                 lane: str = "static:3@model") -> Profile:
    from disco.models.keys import machine_key

    key = machine_key("embedded", "cpu", engine)  # what this machine's profiles are filed under
    return Profile(key=key, dtype="bf16" if engine == "torch" else "Q4_K_M", decision=None,
                   target_ms={1: step, 8: step * 1.1}, target_prefill_ms={prefill_tokens: prefill_ms},
                   assistant_ms={"model": {1: step / 3}}, assistant_prefill_ms={},
                   recommended={"auto": lane if speedup > 1 else "autoregressive", "auto_speedup": speedup},
                   measured_at="2026-12-05 12:00:00")


def test_the_faster_engine_for_a_typical_run_and_where_the_other_wins():
    # torch: a slower step but a lane that pays 2x and a fast prefill; llama.cpp: a fast step, no lane pays, slow prefill
    torch = make_profile("torch", step=200.0, speedup=2.0, prefill_ms=400.0)        # 100 ms/token, 2 ms/prompt token
    llama = make_profile("llamacpp", step=80.0, speedup=1.0, prefill_ms=5000.0)     # 80 ms/token, 25 ms/prompt token
    decision = engines.decide([torch, llama], prompt_tokens=64, new_tokens=64)
    assert decision["engine"] == "torch"  # 64·2 + 64·100 = 6,528 ms against llama.cpp's 64·25 + 64·80 = 6,720
    figs = decision["engines"]
    assert figs["torch"]["decode_ms_per_token"] == pytest.approx(100) and figs["llamacpp"]["prefill_ms_per_token"] == 25
    assert figs["llamacpp"]["run_ms"] == pytest.approx(64 * 25 + 64 * 80)
    assert figs["torch"]["run_ms"] == pytest.approx(64 * 2 + 64 * 100)


def test_the_crossover_names_the_prompt_length_from_which_the_other_engine_wins():
    torch = make_profile("torch", step=200.0, speedup=2.0, prefill_ms=400.0)
    llama = make_profile("llamacpp", step=70.0, speedup=1.0, prefill_ms=2000.0)     # 70 ms/token, 10 ms/prompt token
    decision = engines.decide([torch, llama], prompt_tokens=64, new_tokens=64)
    # llama.cpp: 64·10 + 64·70 = 5,120 ms; torch: 64·2 + 64·100 = 6,528 ms; equal at L = 64·30/8 = 240 prompt tokens
    assert decision["engine"] == "llamacpp" and decision["crossover_prompt_tokens"] == 240
    assert "from about 240 prompt tokens on, torch wins" in decision["reason"]
    assert decision["other_wins_below_prompt_tokens"] is None
    assert engines.decide([torch]) is None


def test_the_choice_is_kept_per_machine_and_auto_follows_it(monkeypatch, tmp_path):
    from disco.models import llama

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path))  # a machine cache of its own: other tests keep the rule
    monkeypatch.setattr(llama, "available", lambda: None)
    monkeypatch.setattr(model_load.torch.cuda, "is_available", lambda: False)
    assert engine_choice.load("embedded") is None
    assert model_load.resolve_engine("auto", "embedded") == "llamacpp"  # nothing measured: the rule for GGUF on a CPU
    profiles.save(make_profile("torch", step=200.0, speedup=2.5, prefill_ms=200.0))
    assert engine_choice.load("embedded") is None  # one engine measured: nothing to decide yet
    profiles.save(make_profile("llamacpp", step=90.0, speedup=1.0, prefill_ms=5000.0))
    decision = engine_choice.load("embedded")
    assert decision["engine"] == "torch" and decision["key"]["flags"]
    assert model_load.resolve_engine("auto", "embedded") == "torch"  # auto follows the measurement
    assert model_load.resolve_engine("llamacpp", "embedded") == "llamacpp"  # an explicit engine is never overridden
    text = machine_tab.engines_md(decision, ["llamacpp", "torch"], ["llamacpp", "torch"])
    assert "torch ◀" in text and "the `auto` engine runs the faster" in text and decision["reason"] in text
    hint = machine_tab.engines_md(None, ["llamacpp"], ["llamacpp", "torch"])
    assert "python -m disco profile --engine torch" in hint and "8.6 GiB" in hint


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_generate_json_names_the_engine_and_its_kernels(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    import tiny_gguf

    target, assistant = tiny_gguf.write_pair(tmp_path / "pair")
    proc = subprocess.run([sys.executable, "-m", "disco", "generate", "--models", f"{target}::{assistant}",
                           "--prompt", "abc", "--max-new-tokens", "6", "--json", "--strategy", "static:2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    from disco.models import llama

    variant = f" ({llama.kernels()})" if llama.kernels() else ""  # a build with a CPU variant per instruction set
    assert rows and all(r["engine"] == "llamacpp" and r["kernels"] == "llama.cpp exact" + variant for r in rows)
