"""The benchmark on the llama.cpp engine (a tiny GGUF pair the test writes): replay validated by timed runs, and
llama.cpp's own programs timed as the peer where scripts/llama-build.sh built them."""

from __future__ import annotations

import pandas as pd
import pytest

from disco.models import llama

if llama.available() is not None:
    pytest.skip(f"llama-cpp-python is not installed: {llama.available()}", allow_module_level=True)

import tiny_gguf  # noqa: E402
from disco import cli  # noqa: E402
from disco.bench import llama_peer  # noqa: E402


def test_bench_on_a_gguf_pair_validates_replay_and_times_llama_cpp(tmp_path):
    target, assistant = tiny_gguf.write_pair(tmp_path / "pair")
    out = tmp_path / "out"
    code = cli.main(["bench", "--models", f"{target}::{assistant}", "--mode", "both", "--timed-prompts", "2",
                     "--max-new-tokens", "10", "--prompts", "code-csv-parse,explain-gil", "--out", str(out),
                     "--no-progress", "--static-ks", "1,3", "--taus", "0.4", "--kmaxes", "4"])
    assert code == 0
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["engine"]) == {"llamacpp"}
    timed = runs[(runs["mode"] == "timed") & (runs["implementation"] == "ours")]
    assert {"autoregressive", "pmin:0.4:3"} <= set(timed["strategy"])
    assert timed["identical_to_autoregressive"].astype(bool).all()
    validation = pd.read_csv(out / "validation.csv")
    assert validation["exact"].astype(bool).all()  # exact kernels: replay's counts are the live engine's
    peers = runs[runs["implementation"] == "llama.cpp"]
    if llama_peer.binary("llama-speculative-simple") is None or llama_peer.binary("llama-bench") is None:
        assert peers.empty
        pytest.skip("llama.cpp's own programs were not built here (scripts/llama-build.sh)")
    assert {"llama:autoregressive", "llama:pmin:0.4:3"} <= set(peers["strategy"])
    spec_rows = peers[peers["strategy"] != "llama:autoregressive"]
    assert spec_rows["same_as_ours"].astype(bool).all()  # its text is ours over the tokens both produced
    assert "llama.cpp" in (out / "summary.md").read_text()
