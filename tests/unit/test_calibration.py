"""Numerics chosen by measurement: the decision rule, the cache key, and the cache's invalidation."""

from __future__ import annotations

import json

import pytest
import torch

from disco.models import numerics as cal

# shapes of ../shared/CPU.md: native bf16 (verification flat) and the same CPU under ONEDNN_MAX_CPU_ISA=AVX2
NATIVE = {"bf16": {1: 170.0, 4: 165.0, 8: 170.0}, "fp32": {1: 330.0, 4: 420.0, 8: 600.0}}
AVX2 = {"bf16": {1: 203.0, 4: 393.0, 8: 934.0}, "fp32": {1: 300.0, 4: 330.0, 8: 380.0}}


def test_native_bf16_is_chosen_where_verification_is_flat():
    dtype, assistant, predicted, reason = cal.decide(NATIVE, {"bf16": 70.0, "fp32": 120.0, "int8": 35.0})
    assert dtype == "bf16" and assistant == "int8"
    assert predicted["bf16"]["k"] >= 4  # flat verification: long drafts pay
    assert "verifying 8 tokens" in reason


def test_emulated_bf16_loses_to_fp32_by_its_verification_cost():
    """A one-token probe would pick bf16 here (203 < 300 ms); the verification shape says fp32."""
    dtype, _, predicted, _ = cal.decide(AVX2, {"bf16": 40.0, "fp32": 60.0, "int8": 27.0})
    assert dtype == "fp32"
    assert predicted["bf16"]["ms_per_token"] > predicted["fp32"]["ms_per_token"]


def test_int8_needs_a_real_margin():
    _, assistant, _, _ = cal.decide(NATIVE, {"bf16": 70.0, "fp32": 120.0, "int8": 68.0})
    assert assistant == "model"  # 3 % cheaper is noise, not a reason to change the draft


def test_autoregressive_wins_when_the_draft_is_as_dear_as_the_target():
    ms, k = cal.best_ms_per_token({1: 100.0, 4: 400.0, 8: 800.0}, assistant_ms=100.0)
    assert k == 0 and ms == pytest.approx(100.0)


def test_interpolation_and_expected_tokens():
    pts = {1: 100.0, 4: 160.0, 8: 200.0}
    assert cal.interpolate(pts, 1) == 100.0 and cal.interpolate(pts, 2) == pytest.approx(120.0)
    assert cal.interpolate(pts, 10) == pytest.approx(220.0)  # extrapolated from the last two points
    assert cal.expected_tokens(0.0, 5) == 1.0 and cal.expected_tokens(1.0, 5) == 6.0
    assert cal.expected_tokens(0.5, 1) == pytest.approx(1.5)


def test_the_key_names_what_changes_the_answer(monkeypatch):
    base = cal.machine_key("embedded", "cpu")
    assert {"cpu", "flags", "onednn_max_cpu_isa", "torch", "threads", "models", "device"} <= set(base)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cal.machine_key("embedded", "cpu") != base
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cal.machine_key("embedded", "cpu") == base
    assert cal.machine_key("a::b", "cpu") != base
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert cal.machine_key("embedded", "cpu") != base


def test_calibrate_the_tiny_pair_then_reuse_and_invalidate(tiny_pair, tmp_path, monkeypatch):
    result = cal.calibrate(tiny_pair, "tiny", reps=1)
    assert set(result.target_ms) == {"bf16", "fp32"} and set(result.target_ms["bf16"]) == set(cal.SIZES)
    assert set(result.assistant_ms) == {"bf16", "fp32", "int8"}
    assert result.dtype in ("bf16", "fp32") and result.assistant_precision in ("model", "int8")
    assert tiny_pair.target.dtype == torch.float32 and tiny_pair.assistant.dtype == torch.float32  # restored
    path = cal.save(result, tmp_path)
    back = cal.load_cached("tiny", "cpu", tmp_path)
    assert back is not None and back.to_dict() == result.to_dict()
    assert result.summary().startswith(f"chose {result.dtype} + {result.assistant_precision} assistant")
    # another key: not reused
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cal.load_cached("tiny", "cpu", tmp_path) is None
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    # a damaged file, or one whose stored key differs from its name's: measured again, never trusted
    path.write_text("{not json")
    assert cal.load_cached("tiny", "cpu", tmp_path) is None
    data = result.to_dict()
    data["key"] = dict(data["key"], torch="0.0")
    path.write_text(json.dumps(data))
    assert cal.load_cached("tiny", "cpu", tmp_path) is None


def test_a_read_only_cache_only_costs_a_remeasurement(tiny_pair, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    result = cal.calibrate(tiny_pair, "tiny", candidates=("fp32",), reps=1)
    assert cal.save(result, blocked / "sub") is None
