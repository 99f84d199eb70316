"""The batch-size study (disco.bench.batch, disco.bench.batch_answer) and its command line: choices on train and
figures on test, the answer on a hand frame, schedules in each engine's format, bad input as one line and exit 2, and
the whole study on the tiny pair's cached tables without loading a model."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from disco.bench.batch import BatchStudy, default_settings, parse_rates, run_study
from disco.bench.batch_answer import answer, markdown, no_speculation_from, schedules, schedules_by_context
from disco.cli import main
from disco.costs.batched import FlatBatch, TokenCurve, resolve_batched
from disco.costs.model import CostModel, CostProfileError, check_profile, read_csv
from disco.errors import BenchError
from test_batched import CURVE, synthetic_table


def _frame(rows):
    base = {"layout": "ragged", "arrival": "closed"}
    return pd.DataFrame([{**base, **r, "kind": r["strategy"].split(":")[0]} for r in rows])


def test_answer_chooses_on_train_and_reports_on_test():
    rows = []
    for split, s2, s4, t3, t4 in (("train", 1.5, 1.4, 1.2, 1.45), ("test", 1.3, 1.6, 1.7, 1.5)):
        rows += [{"split": split, "batch": 1, "strategy": "autoregressive", "speedup": 1.0},
                 {"split": split, "batch": 1, "strategy": "static:2", "speedup": s2},
                 {"split": split, "batch": 1, "strategy": "static:4", "speedup": s4},
                 {"split": split, "batch": 1, "strategy": "threshold:0.3:20", "speedup": t3},
                 {"split": split, "batch": 1, "strategy": "threshold:0.4:20", "speedup": t4}]
    ans = answer(_frame(rows)).iloc[0]
    assert ans.best_static == "static:2" and ans.best_static_speedup == pytest.approx(1.3)  # train's pick, test's figure
    assert ans.best_threshold == "threshold:0.4:20" and ans.reference_speedup == pytest.approx(1.5)
    assert ans.reference_share_of_static == pytest.approx(1.5 / 1.3)
    assert ans.reference_near and ans.speculation_pays


def test_no_speculation_from_and_schedules():
    rows = []
    for batch, (k2, k6) in {1: (1.4, 1.6), 4: (1.2, 1.1), 16: (0.9, 0.7), 64: (0.8, 0.6)}.items():
        for split in ("train", "test"):
            rows += [{"split": split, "batch": batch, "strategy": "autoregressive", "speedup": 1.0},
                     {"split": split, "batch": batch, "strategy": "static:2", "speedup": k2},
                     {"split": split, "batch": batch, "strategy": "static:6", "speedup": k6},
                     {"split": split, "batch": batch, "strategy": "threshold:0.4:20", "speedup": k2 - 0.05}]
    ans = answer(_frame(rows))
    assert no_speculation_from(ans, "ragged") == 16
    sched = schedules(ans, "ragged")
    # vLLM: [bs_lo, bs_hi, K] ranges, each measured B up to the next one - 1, K 0 where no static K pays
    assert sched["vllm"] == {"num_speculative_tokens": 6,
                             "num_speculative_tokens_per_batch_size": [[1, 3, 6], [4, 15, 2], [16, 64, 0]]}
    # TensorRT-LLM: thresholds where the draft length changes; batch size 1 holds max_draft_len
    assert sched["tensorrt_llm"] == {"max_draft_len": 6, "draft_len_schedule": {"1": 6, "4": 2, "16": 0}}
    assert "not expressible" in sched["sglang"]
    json.dumps(sched)
    text = markdown(_frame(rows).assign(tokens_per_s=1.0), ans, "flat:0.05", "python -m disco bench --batch 1")
    assert "No speculation pays from B = 16" in text and "flat:0.05" in text


def test_a_schedule_whose_k_rises_after_batch_one_is_capped_for_tensorrt_and_said():
    rows = []
    for batch, (k2, k6) in {1: (1.4, 1.2), 2: (1.1, 1.3), 4: (1.05, 0.9)}.items():
        for split in ("train", "test"):
            rows += [{"split": split, "batch": batch, "strategy": "autoregressive", "speedup": 1.0},
                     {"split": split, "batch": batch, "strategy": "static:2", "speedup": k2},
                     {"split": split, "batch": batch, "strategy": "static:6", "speedup": k6}]
    sched = schedules(answer(_frame(rows)), "ragged")
    assert sched["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 3, 6], [4, 4, 2]]
    trt = sched["tensorrt_llm"]
    assert trt["max_draft_len"] == 2 and trt["draft_len_schedule"] == {"1": 2}
    assert "not expressible exactly" in trt["note"] and "B = 2" in trt["note"]


def _valid_for_vllm(entries):
    """The rules vLLM's five-item schedule is checked against (read in a fork carrying PR #48944's form): batch-size
    ranges from 1, sorted, not overlapping; context ranges from 1 and contiguous; every batch range over every context
    range; K >= 0."""
    bs = sorted({(e[0], e[1]) for e in entries})
    ctx = sorted({(e[2], e[3]) for e in entries})
    assert bs[0][0] == 1 and all(lo <= hi for lo, hi in bs) and all(b[0] > a[1] for a, b in zip(bs, bs[1:]))
    assert ctx[0][0] == 1 and all(b[0] == a[1] + 1 for a, b in zip(ctx, ctx[1:]))
    assert len(entries) == len(bs) * len(ctx) == len({(e[0], e[1], e[2]) for e in entries})
    assert all(e[4] >= 0 for e in entries)


def test_schedules_start_at_batch_size_one_where_it_was_not_measured():
    rows = []
    for batch, k2 in {2: 1.3, 8: 0.9}.items():
        for split in ("train", "test"):
            rows += [{"split": split, "batch": batch, "strategy": "autoregressive", "speedup": 1.0},
                     {"split": split, "batch": batch, "strategy": "static:2", "speedup": k2}]
    sched = schedules(answer(_frame(rows)), "ragged")
    assert sched["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 7, 2], [8, 8, 0]]
    assert "batch size 1 was not measured" in sched["vllm"]["note"]
    assert "batch size 1 was not measured" in sched["tensorrt_llm"]["note"]


def test_the_answer_and_schedules_by_context_length():
    """A study over cached contexts answers per (layout, context, B) and writes vLLM's batch x context entries."""
    rows = []
    for context, ks in ((0, {1: (1.4, 1.6), 8: (1.2, 1.1)}), (8192, {1: (1.3, 1.9), 8: (1.1, 1.4)})):
        for batch, (k2, k6) in ks.items():
            for split in ("train", "test"):
                rows += [{"split": split, "batch": batch, "context": context, "strategy": s, "speedup": v}
                         for s, v in (("autoregressive", 1.0), ("static:2", k2), ("static:6", k6),
                                      ("threshold:0.4:20", k2))]
    ans = answer(_frame(rows))
    assert list(zip(ans["context"], ans["batch"], ans["best_static"])) == [
        (0, 1, "static:6"), (0, 8, "static:2"), (8192, 1, "static:6"), (8192, 8, "static:6")]
    both = schedules_by_context(ans, "ragged")
    assert both["by_context"]["0"]["vllm"]["num_speculative_tokens_per_batch_size"] == [[1, 7, 6], [8, 8, 2]]
    entries = both["vllm_batch_x_context"]["num_speculative_tokens_per_batch_size"]
    assert entries == [[1, 7, 1, 8191, 6], [1, 7, 8192, 2**31 - 1, 6], [8, 8, 1, 8191, 2], [8, 8, 8192, 2**31 - 1, 6]]
    _valid_for_vllm(entries)
    text = markdown(_frame(rows).assign(tokens_per_s=1.0), ans, "roofline:h100", "python -m disco bench --batch 1,8")
    assert "## By context length" in text and "changes with the context at B = 8" in text
    assert "8192 tokens cached before each prompt" in text
    json.dumps(both)


def test_study_runs_every_point_with_the_target_alone_as_its_baseline():
    tables = [synthetic_table(s) for s in range(4)]
    study = BatchStudy(batches=(1, 4), layouts=("ragged", "padded-k"), rates=("0.5x",),
                       settings=("static:3", "threshold:0.4:20", "batchstop:8"), requests=12, seeds=2)
    rows = run_study({"train": tables[:2], "test": tables[2:]}, TokenCurve(CURVE), "test.csv", study, 24,
                     progress=False)
    closed = rows[rows["arrival"] == "closed"]
    assert len(closed) == 2 * 2 * 2 * 4  # splits x layouts x batches x (settings + the target alone)
    assert (rows.loc[rows["strategy"] == "autoregressive", "speedup"] == 1.0).all()
    assert set(rows["label"]) == {TokenCurve(CURVE).label}
    assert {"strategy", "batch", "layout", "cost_profile", "tokens_per_s", "speedup", "tpot_ms_p50", "tpot_ms_p99",
            "ttft_ms_p50"} <= set(rows.columns)
    assert (rows[rows["arrival"] == "0.5x"]["batch"] == 4).all()


def test_the_study_is_the_same_on_one_process_or_several():
    """(split, layout) jobs run on forked workers: the rows, in order, equal one process's."""
    tables = [synthetic_table(s) for s in range(4)]
    study = BatchStudy(batches=(1, 4), layouts=("ragged", "llama-split", "padded-max"), rates=("0.8x",),
                       settings=("static:3", "threshold:0.4:20", "batchstop:8"), requests=12, seeds=1)
    one = run_study({"train": tables[:2], "test": tables[2:]}, TokenCurve(CURVE), "t", study, 24, progress=False,
                    workers=1)
    three = run_study({"train": tables[:2], "test": tables[2:]}, TokenCurve(CURVE), "t", study, 24, progress=False,
                      workers=3)
    pd.testing.assert_frame_equal(one, three)


def test_default_settings_hold_the_reference_and_the_batch_stop():
    settings = default_settings()
    assert "threshold:0.4:20" in settings and "batchstop:20" in settings and settings[0] == "autoregressive"


@pytest.mark.parametrize("kwargs", [dict(batches=()), dict(batches=(0,)), dict(batches=(2000,)), dict(layouts=("diagonal",)),
                                    dict(rates=("0",)), dict(rates=("-1x",)), dict(settings=("batchstop:x",))])
def test_bad_study_input_is_one_line(kwargs):
    with pytest.raises((BenchError, ValueError)) as err:
        BatchStudy(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, needle", [
    (["--batch", "2", "--batch-contexts", "-1"], "--batch-contexts"), (["--batch-contexts", "4096"], "goes with --batch"),
    (["--batch", "2", "--batch-contexts", "5000000"], "from 0 to"), (["--layouts", "ragged"], "goes with --batch"),
    (["--batch", "0"], "out of range"), (["--batch", "2000"], "out of range"), (["--batch", "2", "--layouts", "x"],
                                                                               "unknown layout"),
    (["--batch", "2", "--arrival-rates", "0"], "must be > 0"), (["--batch", "2", "--arrival-rates", "fast"],
                                                                "arrival rate"),
])
def test_bench_batch_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    assert main(["bench", "--models", "tiny", "--cost-profile", "flat:0.05", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_profile_csv_with_a_bad_batch_column_is_one_line(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("role,precision,kind,tokens,ms,batch,context,layout\ntarget,model,step,1,10,2.5,64,streams\n"
                    "assistant,model,step,1,2,1,64,streams\n")
    with pytest.raises(CostProfileError) as err:
        check_profile(str(path))
    assert "batch" in str(err.value) and "\n" not in str(err.value)


def test_a_batched_csv_reads_as_batch_one_or_as_a_grid(tmp_path):
    path = tmp_path / "p.csv"
    rows = ["role,precision,kind,tokens,ms,batch,context,layout"]
    for b in (1, 4):
        for k in (1, 4):
            rows += [f"target,model,step,{k},{10 * b + k},{b},64,streams", f"assistant,model,step,{k},{b + k},{b},64,"
                     "streams"]
    path.write_text("\n".join(rows) + "\n")
    one = read_csv(path)
    assert one.target_ms(1) == pytest.approx(11.0) and one.target_ms(4) == pytest.approx(14.0)
    grid = resolve_batched(check_profile(str(path)))
    assert grid.target_ms([4] * 4, [64] * 4) == pytest.approx(44.0)
    assert isinstance(resolve_batched("flat:0.05"), FlatBatch)
    plain = tmp_path / "plain.csv"
    plain.write_text("role,precision,kind,tokens,ms\ntarget,model,step,1,10\nassistant,model,step,1,2\n")
    assert isinstance(resolve_batched(str(plain)), TokenCurve)


def test_parse_rates():
    assert parse_rates(["2.5", "0.8x"]) == [("2.5", 2.5, False), ("0.8x", 0.8, True)]


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_bench_batch_on_the_tiny_pairs_tables(tmp_path, capsys):
    args = ["bench", "--models", "tiny", "--mode", "replay", "--prompts", "code-binary-search,code-lru-cache,"
            "explain-gil,prose-advice", "--max-new-tokens", "16", "--cost-profile", "flat:0.1",
            "--cache-dir", str(tmp_path / "tables"), "--out", str(tmp_path / "out"), "--no-peer", "--batch", "1,2",
            "--layouts", "ragged", "--arrival-rates", "0.5x", "--batch-seeds", "1", "--batch-requests", "8",
            "--static-ks", "2", "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0  # the second run finds every table in the cache: no model is loaded
    err = capsys.readouterr().err
    assert "running the bench first" not in err
    for name in ("batch.csv", "batch_answer.csv", "batch_schedules.json", "batch.md", "batch_heatmaps.html"):
        assert (tmp_path / "out" / name).is_file()
    frame = pd.read_csv(tmp_path / "out" / "batch.csv")
    assert set(frame["batch"]) == {1, 2} and set(frame["layout"]) == {"ragged"} and set(frame["context"]) == {0}
    # --report-only in the study's folder rebuilds its answer, schedules and markdown from batch.csv alone
    before = {n: (tmp_path / "out" / n).read_text() for n in ("batch_answer.csv", "batch_schedules.json", "batch.md")}
    for name in before:
        (tmp_path / "out" / name).write_text(before[name] if name != "batch_answer.csv" else "")
    assert main(["bench", "--report-only", "--out", str(tmp_path / "out")]) == 0
    assert {n: (tmp_path / "out" / n).read_text() for n in before} == before


def test_a_roofline_answer_comes_with_its_band():
    from types import SimpleNamespace

    from disco.bench.batch_answer import band_markdown
    from disco.bench.batch_run import _band
    from disco.costs.roofline import roofline_costs

    tables = [synthetic_table(s) for s in range(4)]
    study = BatchStudy(batches=(1, 16), layouts=("padded-k",), rates=(), settings=("static:2", "static:6",
                       "threshold:0.4:20"), requests=8, seeds=1)
    by_split = {"train": tables[:2], "test": tables[2:]}
    costs = roofline_costs("roofline:h100")
    assert "uncalibrated" in costs.label and "H100" in costs.label
    band = _band("roofline:h100:bf16", by_split, study, SimpleNamespace(max_new_tokens=24))
    assert list(band["batch"]) == [1, 16] and (band["models"] == 11).all()
    # the band's models differ: τ 0.4 / 20's speed-up spreads at every B (kernel and host time move its cost ratio)
    assert (band["reference_speedup_low"] < band["reference_speedup_high"]).all()
    assert set(band["best_static"]) <= {"static:2", "static:6"} and band["flips"].dtype == bool
    assert "Uncertainty band (predicted on H100" in band_markdown(band, costs.label)


def test_profile_fit_roofline_reports_held_out_errors_and_calibrates_this(tmp_path, monkeypatch, capsys):
    from disco.costs.roofline import roofline_costs

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    truth = roofline_costs("roofline:this").with_factors({"bandwidth_efficiency": 0.3, "compute_efficiency": 0.2,
                                                          "kernel_us": 40.0, "host_ms": 0.5})
    rows = ["role,precision,kind,tokens,ms,batch,context,layout"]
    for role in ("target", "assistant"):
        for b in (1, 2, 4):
            for k in (1, 4, 16):
                for c in (64, 256):
                    ms = truth.pass_ms(role, [k] * b, [c] * b)
                    rows.append(f"{role},model,step,{k},{ms},{b},{c},streams")
    path = tmp_path / "batched.csv"
    path.write_text("\n".join(rows) + "\n")
    assert "uncalibrated" in roofline_costs("roofline:this").label
    assert main(["profile", "--fit-roofline", str(path)]) == 0
    out = capsys.readouterr().out
    assert "small-to-large" in out and "target-to-assistant" in out
    fitted = roofline_costs("roofline:this")
    assert "calibrated on measured passes" in fitted.label
    assert fitted.target_ms([8] * 4, [128] * 4) == pytest.approx(truth.target_ms([8] * 4, [128] * 4), rel=0.02)
    plain = tmp_path / "plain.csv"
    plain.write_text("role,precision,kind,tokens,ms\ntarget,model,step,1,10\nassistant,model,step,1,2\n")
    assert main(["profile", "--fit-roofline", str(plain)]) == 2


def test_synthetic_acceptance_for_each_chosen_k_follows_vllms_rules():
    from disco.bench.batch_run import synthetic_acceptance

    tables = [synthetic_table(s) for s in range(4)]
    ans = pd.DataFrame({"best_static": ["static:3", "static:5", None, "static:3"]})
    out = synthetic_acceptance(ans, {"train": tables[:2], "test": tables[2:]}, 24)
    assert sorted(out) == ["3", "5"]
    for k, config in out.items():
        rates = config["synthetic_acceptance_rates"]
        assert config["num_speculative_tokens"] == int(k) == len(rates)
        assert config["rejection_sample_method"] == "synthetic"
        assert all(0 <= r <= 1 for r in rates) and rates == sorted(rates, reverse=True)


def test_a_head_drafter_costs_one_target_layer_and_says_so():
    from disco.costs.batched import HEAD_NOTE, head_share, with_drafter
    from disco.costs.roofline import roofline_costs

    # one layer (QKV 3.1M + O 2.4M + MLP 41.3M) and the LM head (233.4M, ~5 layers) of the embedded target's 1,544M
    assert head_share() == pytest.approx((46_792_704 + 233_373_696) / 1_543_569_408)
    flat = with_drafter(FlatBatch(0.4, 28.0), "head")
    assert flat.assistant_ms([1, 1], [9, 9]) == pytest.approx(28.0 * head_share()) and HEAD_NOTE in flat.label
    h100 = roofline_costs("roofline:h100")
    head = with_drafter(h100, "head")
    assert head.assistant_shape.layers == 1 and head.assistant_shape.hidden == h100.target_shape.hidden
    assert head.assistant_ms([1] * 8, [512] * 8) < h100.assistant_ms([1] * 8, [512] * 8)
    assert head.target_ms([3] * 8, [512] * 8) == h100.target_ms([3] * 8, [512] * 8)
    assert with_drafter(h100, "assistant") is h100
    with pytest.raises(CostProfileError):
        with_drafter(h100, "medusa")
    with pytest.raises(BenchError):
        BatchStudy(drafter="medusa")


def test_a_study_over_cached_contexts_keeps_context_zero_as_it_was():
    """``contexts``: one more axis of the study; its context-0 rows are the rows of a study without it, and a longer
    context under a roofline makes every setting's throughput lower."""
    from disco.costs.roofline import roofline_costs

    tables = [synthetic_table(s) for s in range(4)]
    costs = roofline_costs("roofline:h100")
    kw = dict(batches=(1, 8), layouts=("padded-k",), rates=(), settings=("static:3", "threshold:0.4:20"),
              requests=12, seeds=1)
    by_split = {"train": tables[:2], "test": tables[2:]}
    plain = run_study(by_split, costs, "roofline:h100", BatchStudy(**kw), 24, progress=False, workers=1)
    both = run_study(by_split, costs, "roofline:h100", BatchStudy(**kw, contexts=(32768, 0)), 24, progress=False,
                     workers=1)
    assert sorted(both["context"].unique()) == [0, 32768]
    zero = both[both["context"] == 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(zero, plain.reset_index(drop=True))
    far = both[both["context"] == 32768].reset_index(drop=True)
    assert (far["tokens_per_s"] < zero["tokens_per_s"]).all()
    ans = answer(both)
    assert len(ans) == 2 * 2 and set(ans["context"]) == {0, 32768}


def test_report_only_on_a_folder_that_is_not_a_batch_study_is_one_line(tmp_path, capsys):
    (tmp_path / "batch.csv").write_text("role,precision,kind,tokens,ms,batch,context,layout\n"
                                        "target,model,step,1,10,1,64,streams\n")
    assert main(["bench", "--report-only", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a batch study" in err[0]
