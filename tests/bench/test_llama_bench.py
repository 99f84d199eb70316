"""The benchmark on the llama.cpp engine (a tiny GGUF pair the test writes): replay validated by timed runs, and
llama.cpp's own programs timed as the peer where scripts/llama-build.sh built them."""

from __future__ import annotations

import json

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
    # on a busy machine llama.cpp's example can exit before its logger prints its figures, in every try: the run is
    # then left out, named in meta.json and the report (tests/bench/test_llama_bench.py's last test)
    missing = {m["strategy"] for m in json.loads((out / "meta.json").read_text()).get("peer_missing", [])}
    assert "llama:autoregressive" in set(peers["strategy"])
    assert "llama:pmin:0.4:3" in set(peers["strategy"]) or "pmin:0.4:3" in missing
    spec_rows = peers[peers["strategy"] != "llama:autoregressive"]
    assert spec_rows["same_as_ours"].astype(bool).all()  # its text is ours over the tokens both produced
    assert "llama.cpp" in (out / "summary.md").read_text()


def test_holdout_timing_and_the_other_engine_in_one_run(tmp_path, monkeypatch, tiny_pair):
    """``--holdout`` times the train prompts' best settings on the test prompts only; ``--other-engine torch`` times
    that engine's target alone right after each prompt (here the tiny torch pair: the same weights as the GGUF pair),
    and the report sets every timed lane against it."""
    from disco.bench import run as bench_run
    from disco.models import load as model_load

    target, assistant = tiny_gguf.write_pair(tmp_path / "pair")
    real, real_engine = bench_run.load_pair, model_load.resolve_engine
    # two GGUF files run on llama.cpp only: stand in the tiny torch pair (the same weights) as the "torch engine"
    monkeypatch.setattr(model_load, "resolve_engine", lambda engine, spec, device="auto", dtype="auto":
                        "torch" if engine == "torch" else real_engine(engine, spec, device, dtype))
    monkeypatch.setattr(bench_run, "load_pair", lambda models, engine=None, **kw: tiny_pair if engine == "torch"
                        else real(models, engine=engine, **kw))
    out = tmp_path / "out"
    code = cli.main(["bench", "--models", f"{target}::{assistant}", "--mode", "both", "--holdout", "--no-peer",
                     "--other-engine", "torch", "--max-new-tokens", "10", "--prompts", "code-csv-parse,code-binary-search",
                     "--out", str(out), "--no-progress", "--static-ks", "1,3", "--taus", "0.4", "--kmaxes", "4"])
    assert code == 0
    runs = pd.read_csv(out / "runs.csv")
    timed = runs[runs["mode"] == "timed"]
    assert set(timed["prompt_id"]) == {"code-binary-search"}  # the test prompt only
    other = timed[timed["strategy"] == "torch:autoregressive"]
    assert len(other) == 1 and (other["implementation"] == "torch").all() and (other["engine"] == "torch").all()
    assert other["same_as_ours"].astype(bool).all()  # same weights, same greedy text
    ours_ar = timed[(timed["strategy"] == "autoregressive") & (timed["implementation"] == "ours")]
    assert float(other["speedup"].iloc[0]) == pytest.approx(float(ours_ar["seconds"].iloc[0]) / float(other["seconds"].iloc[0]))
    meta = __import__("json").loads((out / "meta.json").read_text())
    assert meta["timed_split"] == "test" and meta["best_train"]["best_static"] in ("static:1", "static:3")
    engines = pd.read_csv(out / "engines.csv")
    ours = timed[timed["implementation"] == "ours"]
    assert set(engines["strategy"]) == set(ours["strategy"])
    for r in engines.itertuples():
        row = ours[ours["strategy"] == r.strategy].iloc[0]
        assert r.vs_other_engine == pytest.approx((row["new_tokens"] / row["seconds"]) /
                                                  (other["new_tokens"].iloc[0] / other["seconds"].iloc[0]))
    assert "Against plain decoding on each engine" in (out / "summary.md").read_text()


def test_holdout_needs_both_splits(tmp_path, capsys):
    target, assistant = tiny_gguf.write_pair(tmp_path / "pair")
    code = cli.main(["bench", "--models", f"{target}::{assistant}", "--mode", "both", "--holdout", "--no-peer",
                     "--max-new-tokens", "6", "--prompts", "code-csv-parse", "--out", str(tmp_path / "o"),
                     "--no-progress", "--static-ks", "1", "--taus", "0.4", "--kmaxes", "4"])
    assert code == 2 and "--holdout needs prompts of both splits" in capsys.readouterr().err
    code = cli.main(["bench", "--models", "tiny", "--mode", "replay", "--holdout", "--out", str(tmp_path / "o2")])
    assert code == 2 and "--holdout needs --mode both" in capsys.readouterr().err
    code = cli.main(["bench", "--models", "tiny", "--mode", "replay", "--other-engine", "llamacpp",
                     "--out", str(tmp_path / "o3")])
    assert code == 2 and "--other-engine times the target alone" in capsys.readouterr().err


def test_a_speculative_run_whose_statistics_were_lost_is_repeated(monkeypatch, tmp_path):
    """llama.cpp's logger can exit before printing the example's closing statistics, or in the middle of them
    (llama_peer.ATTEMPTS): such a run is repeated, and a run that keeps losing them is an error naming what it
    printed."""
    import subprocess

    from disco.policies import parse_strategy

    stats = ("0.01.2 I decoded   11 tokens in    0.250 seconds, speed: 44.0 t/s\n0.01.2 I \n0.01.2 I n_draft   = 4\n"
             "0.01.2 I n_predict = 11\n0.01.2 I n_drafted = 7\n0.01.2 I n_accept  = 5\n0.01.2 I accept    = 71.429%\n")
    cut = stats[:stats.index("n_accept")]  # the log ended inside the figures (n_drafted printed, n_accept not)
    outputs = iter([("\n\nPROMPTab", "loading draft model\n"), ("\n\nPROMPTab", cut),
                    ("\n\nPROMPTabc\n\n", stats[:stats.index(" I accept")]), ("\n\nPROMPTabc\n\n", stats)])
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        out, err = next(outputs)
        return subprocess.CompletedProcess(cmd, 0, out, err)

    class Tok:
        @staticmethod
        def decode(ids, skip_special_tokens=False):
            return "PROMPT"

    pair = type("P", (), {"tokenizer": Tok, "assistant_model": None, "assistant_path": tmp_path / "a.gguf",
                          "target_path": tmp_path / "t.gguf", "context_length": 64})()
    monkeypatch.setattr(llama_peer.subprocess, "run", fake_run)
    monkeypatch.setattr(llama_peer, "binary", lambda name: tmp_path / name)
    got = llama_peer.speculative(pair, [1, 2], parse_strategy("pmin:0.4:4:0"), 10)
    assert len(calls) == 4
    assert llama_peer.statistics(stats.replace("71.429%", "-nan%"))["n_accept"] == 5  # nothing drafted: 0/0 printed
    assert (got["seconds"], got["new_tokens"], got["drafted"], got["accepted"], got["text"]) == (0.25, 11, 7, 5, "abc")

    outputs = iter([("\n\nPROMPTa", "loading draft model\n")] * llama_peer.ATTEMPTS)
    with pytest.raises(RuntimeError, match="no statistics in .* runs: loading draft model"):
        llama_peer.speculative(pair, [1, 2], parse_strategy("pmin:0.4:4:0"), 10)


def test_a_peer_run_without_statistics_is_left_out_and_named(tmp_path, monkeypatch):
    """llama.cpp's example printing no figures in every try (its logger exits unflushed on a busy machine) costs that
    peer row only: the benchmark finishes, and meta.json and the report name what is missing."""
    target, assistant = tiny_gguf.write_pair(tmp_path / "pair")
    calls = []

    def no_statistics(pair, ids, policy, max_new_tokens):
        calls.append(policy.spec)
        raise llama_peer.NoStatistics("llama-speculative-simple printed no statistics in 4 runs: (test)")

    monkeypatch.setattr(llama_peer, "has_peer", lambda policy: True)
    monkeypatch.setattr(llama_peer, "plain", lambda pair, n, reps=1: {"seconds": 1.0, "tokens_per_s": n, "new_tokens": n,
                                                                       "text": None, "command": "llama-bench (test)"})
    monkeypatch.setattr(llama_peer, "speculative", no_statistics)
    out = tmp_path / "out"
    code = cli.main(["bench", "--models", f"{target}::{assistant}", "--mode", "timed", "--timed-prompts", "1",
                     "--max-new-tokens", "6", "--prompts", "code-csv-parse", "--timed-strategies",
                     "autoregressive,pmin:0.4:3", "--out", str(out), "--no-progress"])
    assert code == 0 and calls == ["pmin:0.4:3"]
    meta = json.loads((out / "meta.json").read_text())
    assert [m["strategy"] for m in meta["peer_missing"]] == ["pmin:0.4:3"]
    assert "missing from the peer table" in (out / "summary.md").read_text()
    runs = pd.read_csv(out / "runs.csv")
    assert "llama:pmin:0.4:3" not in set(runs["strategy"]) and "pmin:0.4:3" in set(runs["strategy"])


def test_without_llama_cpps_programs_the_run_says_so_once(tmp_path, monkeypatch, caplog):
    """./run.sh does not build llama.cpp's own programs (scripts/llama-build.sh programs does): a timed run on the
    llama.cpp engine then says once that its peer is not timed, and meta.json names what is missing."""
    monkeypatch.setenv(llama_peer.BIN_ENV, str(tmp_path / "no-programs"))
    target, assistant = tiny_gguf.write_pair(tmp_path / "pair")
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="disco.bench.peer"):
        code = cli.main(["bench", "--models", f"{target}::{assistant}", "--mode", "timed", "--timed-prompts", "2",
                         "--max-new-tokens", "6", "--prompts", "code-csv-parse,explain-gil", "--out", str(out),
                         "--no-progress", "--static-ks", "2", "--taus", "0.4", "--kmaxes", "4"])
    assert code == 0
    said = [r.getMessage() for r in caplog.records if "not built here" in r.getMessage()]
    assert len(said) == 1 and "scripts/llama-build.sh programs" in said[0], said
    meta = json.loads((out / "meta.json").read_text())
    assert meta["peer_programs_missing"] == ["llama-speculative-simple", "llama-bench"]
    runs = pd.read_csv(out / "runs.csv")
    assert runs[runs["implementation"] == "llama.cpp"].empty
