"""Pricing llama.cpp's exact kernels (``disco.bench.kernel_price``): llama-bench run both ways with the right flags and
environment, its CSV read, the floor from the GGUF's bytes and the bandwidth, the cache, and one line when llama-bench
is missing. A real llama-bench run on a tiny GGUF where the build has it."""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import pytest

import tiny_gguf
from disco.bench import kernel_price, llama_peer

FIELDS = ["n_prompt", "n_gen", "n_depth", "avg_ns", "avg_ts", "model_size"]


def _csv(rows) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, FIELDS)
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


@pytest.fixture
def fake_bench(monkeypatch, tmp_path):
    calls = []

    def run(cmd, env, timeout):
        exact = cmd[cmd.index("--repack") + 1] == "0"
        calls.append((cmd, env))
        one = 40.0 if exact else 30.0  # ms of a one-token pass; k tokens cost k^0.8 passes
        prompts = [int(x) for x in cmd[cmd.index("-p") + 1].split(",") if int(x)]
        rows = [{"n_prompt": n, "n_gen": 0, "n_depth": 0, "avg_ns": int(one * n ** 0.8 * 1e6), "avg_ts": 0,
                 "model_size": 1000} for n in prompts]
        if int(cmd[cmd.index("-n") + 1]):
            rows.append({"n_prompt": 0, "n_gen": 32, "n_depth": 40, "avg_ns": 0, "avg_ts": 1000 / one,
                         "model_size": 1000})
        return SimpleNamespace(returncode=0, stdout=_csv(rows), stderr="")

    monkeypatch.setattr(kernel_price, "_run", run)
    monkeypatch.setattr(kernel_price, "binary", lambda name: tmp_path / name)
    monkeypatch.setattr(kernel_price, "bandwidth_gbs", lambda threads=None, **_: 10.0 if threads == 1 else 20.0)
    return calls


def test_both_kernel_sets_priced_with_their_flags(fake_bench, tmp_path):
    target, _ = tiny_gguf.write_pair(tmp_path)
    data = kernel_price.get(target, root=tmp_path / "cache", reps=1)
    exact_envs = [env.get("GGML_CPU_TILED_MM") for cmd, env in fake_bench if cmd[cmd.index("--repack") + 1] == "0"]
    default_envs = [env.get("GGML_CPU_TILED_MM") for cmd, env in fake_bench if cmd[cmd.index("--repack") + 1] == "1"]
    calls_per_set = len(kernel_price.SIZES) + 2  # a call per pass size, plain decoding, the prefill
    assert exact_envs == ["0"] * calls_per_set and default_envs == [None] * calls_per_set
    assert all("-d" in cmd and cmd[cmd.index("-d") + 1] == "40" for cmd, _ in fake_bench[:1])
    assert data["passes_ms"]["exact"][1] == pytest.approx(40.0) and data["passes_ms"]["default"][4] == pytest.approx(
        30 * 4 ** 0.8)
    assert data["decode_tokens_per_s"]["exact"] == pytest.approx(25.0)
    assert data["weight_bytes"] == kernel_price.weight_bytes(target) > 0
    assert data["floor_ms"] == pytest.approx(data["weight_bytes"] / 20e9 * 1000)
    s = kernel_price.summary(data)
    assert s["exact_over_default"][1] == pytest.approx(4 / 3) and s["verify_over_one"]["exact"][4] == pytest.approx(
        4 ** 0.8)
    text = kernel_price.markdown(data)
    assert "exact ÷ defaults | 1.33" in text and "10.0 GB/s on one thread" in text and "nan" not in text
    calls = len(fake_bench)
    again = kernel_price.get(target, root=tmp_path / "cache")  # cached: llama-bench does not run again
    assert len(fake_bench) == calls and again["passes_ms"] == data["passes_ms"]


def test_each_runnable_cpu_variant_is_priced_with_its_own_module(fake_bench, monkeypatch, tmp_path):
    from disco.models import llama
    from disco.models.cpu_variant import Variant

    target, _ = tiny_gguf.write_pair(tmp_path)
    found = [Variant("zen4", "/lib/libggml-cpu-zen4.so", 300), Variant("haswell", "/lib/libggml-cpu-haswell.so", 50)]
    monkeypatch.setattr(llama, "runnable_variants", lambda: found)
    data = kernel_price.measure_variants(target, reps=1)
    assert list(data) == ["zen4", "haswell"]
    per_variant = 2 * (len(kernel_price.SIZES) + 2)
    paths = [env.get("GGML_BACKEND_PATH") for _, env in fake_bench]
    assert paths == ["/lib/libggml-cpu-zen4.so"] * per_variant + ["/lib/libggml-cpu-haswell.so"] * per_variant
    text = kernel_price.variants_markdown(data, "zen4")
    assert "| zen4 ◀ | 40 |" in text and "| haswell | 40 |" in text and f"({4 ** 0.8:.2f}×)" in text
    monkeypatch.setattr(llama, "runnable_variants", lambda: [])
    assert kernel_price.measure_variants(target, reps=1) == {}


def test_a_variant_that_fails_is_a_row_of_its_own(fake_bench, monkeypatch, tmp_path):
    from disco.models import llama
    from disco.models.cpu_variant import Variant

    target, _ = tiny_gguf.write_pair(tmp_path)
    found = [Variant("broken", "/lib/libggml-cpu-broken.so", 900), Variant("haswell", "/lib/libggml-cpu-haswell.so", 50)]
    monkeypatch.setattr(llama, "runnable_variants", lambda: found)
    real_run = kernel_price._run

    def run(cmd, env, timeout):
        if env.get("GGML_BACKEND_PATH", "").endswith("broken.so"):
            return SimpleNamespace(returncode=-11, stdout="", stderr="Segmentation fault")
        return real_run(cmd, env, timeout)

    monkeypatch.setattr(kernel_price, "_run", run)
    data = kernel_price.measure_variants(target, reps=1)
    assert "Segmentation fault" in data["broken"]["error"] and data["haswell"]["passes_ms"]["exact"][1] == 40.0
    text = kernel_price.variants_markdown(data, "haswell")
    assert "| broken | not priced: llama-bench failed (-11): Segmentation fault |" in text and "| haswell ◀ |" in text


def test_missing_llama_bench_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel_price, "binary", lambda name: None)
    with pytest.raises(kernel_price.KernelPriceUnavailable, match="llama-bench is not built here"):
        kernel_price.measure_kernels(tmp_path / "model.gguf")


def test_bandwidth_is_a_positive_rate():
    assert kernel_price.bandwidth_gbs(mib=16, threads=2, reps=1) > 0


@pytest.mark.skipif(llama_peer.binary("llama-bench") is None, reason="llama-bench is not built here")
def test_a_real_llama_bench_on_a_tiny_gguf(tmp_path):
    from disco.models import gguf_pair

    target, assistant = tiny_gguf.write_pair(tmp_path)
    data = kernel_price.measure(target, reps=1, pair=gguf_pair.load("tiny-gguf", target, assistant))
    assert data["ours_tokens_per_s"] > 0 and kernel_price.summary(data)["ours_over_llama_bench"] > 0
    assert "Our own target alone decodes" in kernel_price.markdown(data)
    for name in ("exact", "default"):
        assert set(data["passes_ms"][name]) == set(kernel_price.SIZES)
        assert all(v > 0 for v in data["passes_ms"][name].values())
        assert data["prefill_ms_per_token"][name] > 0 and data["decode_tokens_per_s"][name] > 0


def test_the_machine_tab_says_why_when_not_measured():
    from disco.app.machine_tab import kernels_md

    assert kernels_md(None, None) == ""
    assert "not measured: no room" in kernels_md(None, "no room")
