"""The roofline cost model (``disco.costs.roofline``): a hand-computed pass, the batch-1 conversion, the uncertainty
band, the fit and its held-out splits, the labels, one-line errors for every bad input, and ``scripts/gpu_check.py``
on the CPU."""

from __future__ import annotations

import copy
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from disco.costs import roofline
from disco.costs.model import CostModel, CostProfileError
from disco.costs.model import roofline_model as batch1_cost_model
from disco.costs.roofline import (ASSISTANT_SHAPE, TARGET_SHAPE, UNCERTAIN_FACTORS, ModelShape, RooflineCosts,
                                  breakdown, check_roofline, load_devices, roofline_costs)
from disco.costs.roofline_fit import SPLITS, band, fit, held_out_report, split_points
from disco.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelShape(layers=1, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=32)
# 1e-3 GB/s = 1000 bytes/ms at full efficiency (500 at the nominal 0.5); 1e-6 TFLOP/s = 1000 FLOPs/ms
TOY = {"name": "Toy", "kind": "gpu", "memory_bandwidth_gbs": 1e-3, "bf16_tflops": 1e-6, "fp8_tflops": 2e-6,
       "int8_tops": 2e-6, "kernel_us_eager": 20, "kernel_us_graph": 10, "host_ms_per_iteration": 1.0,
       "efficiency": {"bandwidth": [0.4, 0.6], "compute": [1.0, 1.0]},
       "ranges": {"kernel_us_graph": [5, 20], "kernel_us_eager": [10, 40], "host_ms_per_iteration": [0.5, 2.0]},
       "sources": "made up for the test", "measured": None}


def toy_file(tmp_path, **changes) -> Path:
    entry = copy.deepcopy(TOY)
    entry.update(changes)
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"toy": entry}))
    return path


def one_line_error(call, *words):
    with pytest.raises(CostProfileError) as info:
        call()
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message and message.strip()
    for word in words:
        assert word in message, message
    return message


# ---------------------------------------------------------------------------------------------
# the per-operation roofline, by hand


def test_breakdown_of_a_tiny_config_matches_the_hand_computation(tmp_path):
    # one row of 2 query tokens on 3 cached ones, bf16 (2-byte weights and activations)
    ops = {op.name: op for op in breakdown(TINY, [2], [3], "toy", devices=toy_file(tmp_path))}
    # qkv: 8 x (2+2)*4 weights; 2 rows in (8 wide) and out (16 wide)
    hand = {"qkv_proj": (8 * 16 * 2 + 2 * 8 * 2 + 2 * 16 * 2, 2 * 2 * 8 * 16),
            # attention: 5 cached tokens x (K, V) x 1 KV head x 4 dims x 2 bytes, plus q read and output written
            # causal FLOPs: each query sees 3 cached keys and 1 or 2 of its own: 4 x (2 x 3 + 1 + 2) x 2 heads x 4 dims
            "attention": (5 * 2 * 1 * 4 * 2 + 2 * 2 * 8 * 2, 4 * (2 * 3 + 1 + 2) * 2 * 4),
            "o_proj": (8 * 8 * 2 + 2 * 8 * 2 + 2 * 8 * 2, 2 * 2 * 8 * 8),
            # gate+up (8 -> 32) and down (16 -> 8): 3 weight matrices, activations 8 in, 32 out, 16 in, 8 out
            "mlp": (3 * 8 * 16 * 2 + 2 * (8 + 32 + 16 + 8) * 2, 2 * 2 * 3 * 8 * 16),
            # LM head: 8 x 32 weights, 2 rows in, fp32 logits of every position written
            "lm_head": (8 * 32 * 2 + 2 * 8 * 2 + 2 * 32 * 4, 2 * 2 * 8 * 32)}
    assert list(ops) == list(hand)
    assert {k: (op.bytes, op.flops) for k, op in ops.items()} == hand == {
        "qkv_proj": (352, 512), "attention": (144, 288), "o_proj": (192, 256), "mlp": (1024, 1536),
        "lm_head": (800, 1024)}
    # 500 bytes/ms (bandwidth efficiency 0.5, the middle of [0.4, 0.6]) and 1000 FLOPs/ms: the max of the two
    expected = {"qkv_proj": (0.704, "memory"), "attention": (0.288, "memory"), "o_proj": (0.384, "memory"),
                "mlp": (2.048, "memory"), "lm_head": (1.6, "memory")}
    for name, (ms, bound) in expected.items():
        assert ops[name].ms == pytest.approx(ms) and ops[name].bound == bound, name
    costs = RooflineCosts("toy", "bf16", True, None, TINY, TINY, toy_file(tmp_path))
    launch = (1 * 10 + 4) * 10 / 1000  # 14 kernels x 10 us
    assert costs.target_ms([2], [3]) == pytest.approx(5.024 + launch + 1.0)  # host time on the target pass only
    # a draft step reads one row of logits: the LM head's rows in and logits out halve (8 x 32 x 2 + 8 x 2 + 32 x 4)
    assert costs.assistant_ms([2], [3]) == pytest.approx(5.024 - 1.6 + (512 + 16 + 128) / 500 + launch)
    assert costs.target_ms([2], [3], outputs=1) == pytest.approx(costs.assistant_ms([2], [3]) + 1.0)
    assert costs.target_ms([], []) == 0.0


def test_formats_change_bytes_and_compute_path(tmp_path):
    path = toy_file(tmp_path)
    bf16 = {op.name: op for op in breakdown(TINY, [2], [3], "toy", "bf16", devices=path)}
    fp8 = {op.name: op for op in breakdown(TINY, [2], [3], "toy", "fp8", devices=path)}
    assert fp8["qkv_proj"].bytes == 8 * 16 * 1 + 2 * 8 * 1 + 2 * 16 * 1  # W8A8
    assert fp8["qkv_proj"].ms < bf16["qkv_proj"].ms
    assert fp8["lm_head"].bytes == 8 * 32 * 2 + 2 * 8 * 1 + 2 * 32 * 4  # the LM head's weights stay bf16
    w4 = {op.name: op for op in breakdown(TINY, [2], [3], "toy", "w4a16", devices=path)}
    assert w4["mlp"].bytes == pytest.approx(3 * 8 * 16 * (0.5 + 2.5 / 128) + 2 * 64 * 2)


def test_batched_passes_grow_with_rows_and_context():
    costs = roofline_costs("roofline:h100")
    one, many = costs.target_ms([2], [512]), costs.target_ms([2] * 64, [512] * 64)
    assert 0 < one < many and costs.target_ms([2], [4096]) > one
    assert costs.assistant_ms([1], [512]) < costs.target_ms([1], [512])
    ops = {op.name: op for op in costs.breakdown("target", [16] * 64, [512] * 64)}
    assert ops["mlp"].bound == "compute" and costs.breakdown("target", [1], [512])[0].bound == "memory"


# ---------------------------------------------------------------------------------------------
# profiles, labels, the batch-1 conversion


def test_profile_names_are_parsed_and_canonical():
    assert check_roofline("roofline:h100") == "roofline:h100:bf16"
    assert check_roofline(" roofline:H100:FP8 ") == "roofline:h100:fp8"
    assert check_roofline("roofline:this") == "roofline:this:q4_k_m"
    assert check_roofline("roofline:l4:w4a16") == "roofline:l4:w4a16"
    costs = roofline_costs("roofline:rtx4090:fp8")
    assert costs.fmt == "fp8" and costs.target_shape == TARGET_SHAPE and costs.assistant_shape == ASSISTANT_SHAPE
    assert {"h100", "a100", "l4", "rtx4090", "this"} <= set(load_devices())


def test_labels_say_where_the_figures_come_from(tmp_path):
    assert roofline_costs("roofline:h100").label == "predicted on H100 SXM (uncalibrated)"
    assert "uncalibrated" in roofline_costs("roofline:this").label
    assert "eager" in roofline_costs("roofline:a100", graphs=False).label
    measured = toy_file(tmp_path, measured={"where": "an L4 in the lab, 2025", "memory_bandwidth_gbs": 2e-3})
    costs = roofline_costs("roofline:toy", TINY, TINY, devices=measured)
    assert "uncalibrated" not in costs.label and "an L4 in the lab" in costs.label
    assert costs.entry["figures"]["memory_bandwidth_gbs"] == 2e-3  # the measured figure replaces the datasheet's
    fitted = costs.with_factors(costs.factors, calibrated=True)
    assert fitted.label.endswith("(calibrated on measured passes)")


def test_batch1_cost_model_samples_the_device():
    costs = roofline_costs("roofline:h100")
    model = batch1_cost_model(costs)
    assert isinstance(model, CostModel) and [n for n, _ in model.target] == list(roofline.BATCH1_TOKENS)
    assert model.target_ms(8) == pytest.approx(costs.target_ms([8], [512]))
    assert model.assistant_ms(1) == pytest.approx(costs.assistant_ms([1], [512]))
    assert model.meta["profile"] == "roofline:h100:bf16" and model.meta["label"] == costs.label
    assert 0 < model.cost_ratio < 1
    assert CostModel.from_dict(model.to_dict()).target == model.target
    assert batch1_cost_model(costs, context=4096).target_ms(1) > model.target_ms(1)


# ---------------------------------------------------------------------------------------------
# the uncertainty band


def test_band_brackets_the_nominal_model(tmp_path):
    models = band("roofline:toy", TINY, TINY, devices=toy_file(tmp_path))
    assert len(models) == 1 + 2 * len(UNCERTAIN_FACTORS) + 2
    nominal = models[0]
    ranges = roofline.factor_ranges(nominal.entry)
    assert models[1].factors["bandwidth_efficiency"] == ranges["bandwidth_efficiency"][0] == 0.4
    assert models[-2].label.endswith("[fastest corner]") and models[-1].label.endswith("[slowest corner]")
    for rows, contexts in (([2], [3]), ([1] * 8, [100] * 8), ([16] * 4, [0] * 4)):
        values = [m.target_ms(rows, contexts) for m in models]
        assert min(values) <= nominal.target_ms(rows, contexts) <= max(values)
        assert values[-2] == min(values) and values[-1] == max(values)
    # by hand: the qkv projection at the slowest bandwidth (0.4 -> 400 bytes/ms) is 352 / 400 ms
    slow = {op.name: op for op in models[-1].breakdown("target", [2], [3])}
    assert slow["qkv_proj"].ms == pytest.approx(352 / 400)
    h100 = band("roofline:h100")
    assert all(m.fmt == "bf16" for m in h100) and h100[0].label == "predicted on H100 SXM (uncalibrated)"


def test_a_range_with_low_above_high_is_refused(tmp_path):
    bad = toy_file(tmp_path, efficiency={"bandwidth": [0.9, 0.8], "compute": [0.5, 0.6]})
    one_line_error(lambda: band("roofline:toy", TINY, TINY, devices=bad), "toy", "efficiency.bandwidth", "low > high")
    bad = toy_file(tmp_path, ranges={**TOY["ranges"], "host_ms_per_iteration": [2.0, 0.5]})
    one_line_error(lambda: load_devices(bad), "toy", "host_ms_per_iteration", "low > high")


# ---------------------------------------------------------------------------------------------
# fitting to measured passes


def synthetic(costs, batches=(1, 4, 16, 64), tokens=(1, 4, 16), contexts=(256, 2048)) -> list[dict]:
    return [{"role": role, "batch": b, "tokens": k, "context": c,
             "ms": costs.pass_ms(role, [k] * b, [c] * b)}
            for role in ("target", "assistant") for b in batches for k in tokens for c in contexts]


TRUE = {"bandwidth_efficiency": 0.7, "compute_efficiency": 0.6, "kernel_us": 3.0, "host_ms": 0.8}


@pytest.mark.parametrize("split", SPLITS)
def test_held_out_splits_never_overlap_their_training_set(split):
    points = synthetic(roofline_costs("roofline:h100"))
    train, test = split_points(points, split)
    assert train and test and not set(train) & set(test) and sorted(train + test) == list(range(len(points)))
    if split == "target-to-assistant":
        assert {points[i]["role"] for i in train} == {"target"} and {points[i]["role"] for i in test} == {"assistant"}
    if split == "context":
        assert {points[i]["context"] for i in train} == {256} and {points[i]["context"] for i in test} == {2048}
    if split == "small-to-large":
        assert max(points[i]["batch"] * points[i]["tokens"] for i in train) < \
               min(points[i]["batch"] * points[i]["tokens"] for i in test)


def test_held_out_report_tests_only_the_held_out_passes():
    points = synthetic(roofline_costs("roofline:h100"), batches=(1, 8), tokens=(1, 4))
    report = held_out_report(points, "context", device="h100")
    assert report["n"] == len(report["test"]) and not set(report["train"]) & set(report["test"])
    one_line_error(lambda: split_points(points, "sideways"), "small-to-large", "context", "target-to-assistant")
    one_line_error(lambda: split_points([p for p in points if p["context"] == 256], "context"), "leaves")


def test_fit_recovers_known_factors_from_the_models_own_passes():
    truth = roofline_costs("roofline:h100", factors=TRUE)
    points = synthetic(truth)
    factors, report = fit(points, TARGET_SHAPE, ASSISTANT_SHAPE, device="h100")
    for name, value in TRUE.items():
        assert factors[name] == pytest.approx(value, rel=0.02), name
    assert report["worst_abs_pct"] < 0.5 and "calibrated on measured passes" in report["label"]
    held = held_out_report(points, "context", TARGET_SHAPE, ASSISTANT_SHAPE, device="h100")
    assert held["median_abs_pct"] < 0.5 and held["worst_abs_pct"] < 0.5


def test_fit_without_scipy_uses_the_coordinate_search(monkeypatch):
    truth = roofline_costs("roofline:h100", factors=TRUE)
    points = synthetic(truth, batches=(1, 64), tokens=(1, 16))
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)  # import fails
    factors, report = fit(points, device="h100")
    assert report["method"] == "coordinate search" and report["worst_abs_pct"] < 1.0


def test_fit_refuses_bad_points():
    one_line_error(lambda: fit([], device="h100"), "no measured passes")
    one_line_error(lambda: fit([{"role": "target", "batch": 1}], device="h100"), "measured pass 0")
    one_line_error(lambda: fit([{"role": "x", "batch": 1, "tokens": 1, "context": 0, "ms": 1}], device="h100"),
                   "measured pass 0")


# ---------------------------------------------------------------------------------------------
# bad input: one line each


def test_unknown_device_format_and_syntax_are_one_line():
    one_line_error(lambda: check_roofline("roofline:tpu"), "tpu", "h100", "a100", "l4", "rtx4090", "this")
    one_line_error(lambda: check_roofline("roofline:h100:int3"), "int3", "bf16", "fp8", "w4a16", "q4_k_m")
    one_line_error(lambda: check_roofline("roofline:"), "roofline:DEVICE")
    one_line_error(lambda: check_roofline("roofline:h100:bf16:extra"), "roofline:DEVICE")
    one_line_error(lambda: check_roofline("h100"), "roofline:DEVICE")
    one_line_error(lambda: check_roofline("roofline:h100:q4_k_m"), "CPU")
    one_line_error(lambda: check_roofline("roofline:a100:fp8"), "fp8")


@pytest.mark.parametrize("field, value, words", [
    ("memory_bandwidth_gbs", None, ("lacks memory_bandwidth_gbs",)),
    ("bf16_tflops", "fast", ("bf16_tflops", "must be a number")),
    ("kernel_us_graph", 0, ("kernel_us_graph", "positive")),
    ("host_ms_per_iteration", -1.0, ("host_ms_per_iteration", "positive")),
    ("int8_tops", float("nan"), ("int8_tops", "finite")),
    ("fp8_tflops", "none", ("fp8_tflops",)),
    ("kernel_us_eager", 100, ("kernel_us_eager", "outside its range")),
])
def test_bad_devices_file_figures_are_one_line(tmp_path, field, value, words):
    entry = copy.deepcopy(TOY)
    if value is None:
        del entry[field]
    else:
        entry[field] = value
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"toy": entry}))
    one_line_error(lambda: load_devices(path), "toy", *words)
    one_line_error(lambda: roofline_costs("roofline:toy", devices=path), "toy", *words)


def test_unreadable_devices_file_is_one_line(tmp_path):
    path = tmp_path / "devices.json"
    path.write_text("{not json")
    one_line_error(lambda: load_devices(path), "could not be read")
    one_line_error(lambda: load_devices(tmp_path / "absent.json"), "could not be read")
    one_line_error(lambda: load_devices({"toy": {**TOY, "efficiency": {"bandwidth": [0.5, 85], "compute": [1, 1]}}}),
                   "goes above 1")


def test_the_shipped_devices_carry_datasheet_figures():
    devices = load_devices()
    h100 = devices["h100"]["figures"]
    assert h100["memory_bandwidth_gbs"] == 3350 and h100["bf16_tflops"] == 989 and h100["fp8_tflops"] == 1979
    assert devices["a100"]["figures"]["fp8_tflops"] is None and devices["l4"]["figures"]["fp8_tflops"] == 242
    assert devices["this"]["calibrated"] is False and all(d["sources"] for d in devices.values())
    assert all(d["measured"] is None for d in devices.values())


# ---------------------------------------------------------------------------------------------
# shapes


def test_shapes_from_a_config_and_a_gguf(tmp_path):
    config = {"num_hidden_layers": 28, "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
              "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
    assert ModelShape.from_hf_config(config) == TARGET_SHAPE
    assert ModelShape.from_hf_config({**config, "head_dim": 64}).head_dim == 64
    one_line_error(lambda: ModelShape.from_hf_config({"hidden_size": 8}), "shape")
    assert 1.4e9 < TARGET_SHAPE.params < 1.6e9 and 0.45e9 < ASSISTANT_SHAPE.params < 0.55e9
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(TINY.layers)
    writer.add_embedding_length(TINY.hidden)
    writer.add_feed_forward_length(TINY.intermediate)
    writer.add_head_count(TINY.heads)
    writer.add_head_count_kv(TINY.kv_heads)
    writer.add_token_list([f"t{i}" for i in range(TINY.vocab)])
    writer.add_tensor("token_embd.weight", np.zeros((TINY.vocab, TINY.hidden), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert roofline.shape_from_gguf(path) == TINY
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    one_line_error(lambda: roofline.shape_from_gguf(tmp_path / "junk.gguf"), "junk.gguf")


# ---------------------------------------------------------------------------------------------
# the GPU check script, on the CPU


def test_gpu_check_help_runs():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_check.py"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--quick" in done.stdout and "--device" in done.stdout


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_gpu_check_on_the_cpu_writes_a_batched_profile(tmp_path):
    out = tmp_path / "profile.csv"
    command = [sys.executable, str(ROOT / "scripts/gpu_check.py"), "--device", "cpu", "--quick", "--scale", "8",
               "--reps", "1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(out) as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["role", "precision", "kind", "tokens", "ms", "batch", "context", "layout"]
    assert {r["role"] for r in rows} == {"target", "assistant"} and len(rows) == 16
    assert all(r["precision"] == "bf16" and r["kind"] == "step" and r["layout"] == "padded" for r in rows)
    assert all(math.isfinite(float(r["ms"])) and float(r["ms"]) > 0 for r in rows)
    assert "roofline vs eager passes" in done.stdout and "batch invariance" in done.stdout
    summary = json.loads((tmp_path / "profile-summary.json").read_text())
    assert summary["timings"] == "eager" and summary["roofline_device"] == "this"
