"""The batched replay (disco.replay.batched) and its layouts (disco.replay.layouts): slot accounting under continuous
batching, each layout's cost on hand examples, shared vs per-sequence policy state, the batch-level stop, and batch 1
equal to today's replay."""

from __future__ import annotations

import math
import random

import pytest

from disco.costs.batched import BatchGrid, FlatBatch, TokenCurve, check_batch
from disco.costs.model import CostModel, CostProfileError
from disco.policies import parse_strategy
from disco.replay.batched import BatchReplayError, Request, Setting, metrics, request_stream, simulate
from disco.replay.layouts import LayoutError, Pricer, RowPass, check_layout, draft_passes, verify_passes
from disco.replay.run import ReplayRun, replay
from disco.replay.tables import Chain, ReplayTable

EOS = 0


def synthetic_table(seed: int, n_out: int = 24, depth: int = 24, n_prompt: int = 6, eos_end: bool = True) -> ReplayTable:
    """A table with chains at every position: each chain token matches the reference with probability 0.7 (high
    confidence when it does), so every policy has something to stop on."""
    rng = random.Random(seed)
    ref = [rng.randrange(1, 50) for _ in range(n_out - 1)] + ([EOS] if eos_end else [rng.randrange(1, 50)])
    chains = {}
    for p in range(n_out + 1):
        tokens, probs = [], []
        for j in range(depth):
            q = p + j
            match = q < n_out and ref[q] != EOS and rng.random() < 0.7
            tokens.append(ref[q] if match else rng.randrange(50, 100))
            probs.append(rng.uniform(0.5, 1.0) if match else rng.uniform(0.0, 0.6))
        chains[p] = Chain(tokens, probs, False, [1.0] * depth, [0.5] * depth, [0.9] * depth)
    return ReplayTable(list(range(1, n_prompt + 1)), ref, n_out, [EOS], chains, meta={"models": "synthetic"})


CURVE = CostModel([(1, 10.0), (2, 11.0), (4, 13.0), (8, 17.0), (16, 25.0), (64, 73.0), (512, 521.0)],
                  [(1, 2.0), (2, 2.2), (4, 2.6), (8, 3.4), (16, 5.0), (64, 14.6), (512, 104.2)], {"profile": "test"})


def row(t, k=4, calls=0, fed=1, tctx=100, actx=100, prefill=False, outputs=0, slot=0):
    return RowPass(t, k, calls, fed, tctx, actx, prefill, outputs, slot)


# -- layouts on hand examples ----------------------------------------------------------------------------------------

def test_each_layout_lays_out_a_hand_batch():
    # three decoding rows (2, 4 and 0 drafts: logits on every position) and a new row (a 10-token prompt, 1 draft)
    rows = [row(3, k=4, slot=0), row(5, k=4, slot=1), row(1, k=4, slot=2),
            row(12, k=4, tctx=0, prefill=True, outputs=2, slot=3)]
    assert verify_passes("ragged", rows) == [([3, 5, 1, 12], [100, 100, 100, 0], 11)]
    assert verify_passes("padded-max", rows) == [([5, 5, 5, 12], [100, 100, 100, 0], 11)]
    assert verify_passes("padded-k", rows) == [([5, 5, 5, 12], [100, 100, 100, 0], 11)]  # K + 1 = 5 a row
    # 21 tokens round up to the next captured size, 24: three pad tokens ride as one extra row (no logits read)
    assert verify_passes("graph", rows) == [([3, 5, 1, 12, 3], [100, 100, 100, 0, 0], 11)]
    # llama.cpp's equal split over runs of consecutive slots: 1 token from each of the four; slot 2 is then done, so
    # slots 0-1 (2 more each) and slot 3 go apart; then slot 1's last 2, then slot 3's last 11, whose last two
    # tokens are the logits rows it needs
    assert verify_passes("llama-split", rows) == [([1, 1, 1, 1], [100, 100, 100, 0], 3), ([2, 2], [101, 101], 4),
                                                  ([2], [103], 2), ([11], [1], 2)]


def test_llama_split_starts_a_new_ubatch_at_a_gap_in_the_slots():
    # slots 0, 1 and 3 (slot 2 finished): llama.cpp's sequential split takes 0-1 together, then 3 alone
    rows = [row(2, slot=0), row(2, slot=1), row(2, slot=3)]
    assert verify_passes("llama-split", rows) == [([2, 2], [100, 100], 4), ([2], [100], 2)]
    assert len(draft_passes([row(2, calls=2, slot=s) for s in (0, 1, 3)], "llama-split")) == 4  # 2 steps x 2 ubatches
    from disco.models.llama_batch import N_BATCH
    from disco.replay.layouts import UBATCH

    assert UBATCH == N_BATCH  # the split's cap is the live context's n_ubatch


def test_graph_layout_past_the_largest_capture_size_is_not_padded():
    rows = [row(300), row(300)]
    assert verify_passes("graph", rows) == [([300, 300], [100, 100], 600)]


def test_drafting_runs_as_deep_as_the_deepest_row_over_every_drafting_row():
    rows = [row(2, calls=1, fed=2), row(4, calls=3, fed=1, actx=50), row(1, calls=0)]
    assert draft_passes(rows) == [([2, 1], [100, 50], 2), ([1, 1], [102, 51], 2), ([1, 1], [103, 52], 2)]


def test_pricer_adds_up_passes_under_the_token_curve():
    pricer = Pricer(TokenCurve(CURVE), "padded-max")
    rows = [row(2, calls=1, fed=2), row(4, calls=3, fed=1)]
    draft, verify = pricer.iteration_ms(rows)
    assert draft == pytest.approx(CURVE.assistant_ms(3) + 2 * CURVE.assistant_ms(2))
    assert verify == pytest.approx(CURVE.target_ms(8))  # two rows padded to 4 tokens: one ubatch of 8


def test_unknown_layout_is_one_line():
    with pytest.raises(LayoutError) as err:
        check_layout("diagonal")
    assert "\n" not in str(err.value) and "padded-k" in str(err.value)


@pytest.mark.parametrize("bad", [0, -1, 1025, 2.5, "x", float("inf")])
def test_batch_size_checks(bad):
    with pytest.raises(CostProfileError) as err:
        check_batch(bad)
    assert "\n" not in str(err.value)


def test_batch_grid_interpolates_batch_tokens_and_context():
    grid = BatchGrid({"target": {(1, 1, 100): 10.0, (1, 4, 100): 16.0, (4, 1, 100): 20.0, (4, 4, 100): 40.0,
                                 (1, 1, 1000): 20.0, (1, 4, 1000): 26.0, (4, 1, 1000): 30.0, (4, 4, 1000): 50.0,
                                 (1, 64, 0): 300.0, (2, 64, 0): 500.0},
                      "assistant": {(1, 1, 100): 1.0}})
    assert grid.target_ms([1], [100]) == pytest.approx(10.0)
    assert grid.target_ms([4, 4, 4, 4], [100] * 4) == pytest.approx(40.0)
    # B = 2, k = 2 by hand: at context 100, 12 (B 1) and 26 2/3 (B 4) -> 16 8/9; at 1000, 26 8/9; halfway: 21 8/9
    assert grid.target_ms([2, 2], [550, 550]) == pytest.approx(21.0 + 8.0 / 9)
    assert grid.target_ms([1, 1, 1, 1], [550] * 4) == pytest.approx(25.0)
    assert grid.assistant_ms([1, 1], [0, 0]) == pytest.approx(1.0)
    # prefills (context 0) price passes on an empty cache, and nothing else
    assert grid.target_ms([64, 64], [0, 0]) == pytest.approx(500.0)
    assert grid.target_ms([1], [50]) == pytest.approx(10.0 - 5.0 / 9)  # extrapolated from 100 and 1000, not from 0


# -- batch 1 is today's replay ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["autoregressive", "static:3", "threshold:0.4:20", "heuristic:5", "sglang:3",
                                  "bandit", "costaware:20", "pmin:0.5:16:2"])
def test_batch_one_equals_todays_replay(spec):
    tables = [synthetic_table(s) for s in range(4)]
    stream = [Request(i, t) for i, t in enumerate(tables)]
    pricer = Pricer(TokenCurve(CURVE), "ragged")
    log = simulate(spec, stream, 1, pricer, 24)
    total, outputs = 0.0, []
    policy = parse_strategy(spec)
    for i, table in enumerate(tables):
        # a kind engines keep once per batch (the bandit, SGLang's depth) carries its state from one request to the
        # next, as a server does; every other kind starts afresh per request, as today's replay does
        shared = type(policy).batch_shared
        run = ReplayRun(table, policy if shared else parse_strategy(spec), 24, CURVE, bind=not (shared and i))
        while not run.done:
            run.step()
        result = run.result()
        total += sum(r.iteration_ms for r in result.records)
        outputs.append(result.output_ids)
    assert [log.output[i] for i in range(4)] == outputs
    assert log.iterations[-1][0] == pytest.approx(total)
    m = metrics(log, whole=True)
    assert m["tokens_per_s"] == pytest.approx(sum(map(len, outputs)) / total * 1000)


# -- continuous batching ---------------------------------------------------------------------------------------------

def test_slots_refill_and_every_request_finishes_with_its_batch_one_output():
    tables = [synthetic_table(s, n_out=8 + 4 * s) for s in range(5)]
    stream = request_stream(tables, 17, seed=3)
    pricer = Pricer(FlatBatch(0.1), "ragged")
    log = simulate("static:3", stream, 4, pricer, 24)
    assert sorted(r["index"] for r in log.requests) == list(range(17))
    assert max(it[1] for it in log.iterations) == 4 and all(1 <= it[1] <= 4 for it in log.iterations)
    # the batch stays full until the queue runs dry
    full_until = [it for it in log.iterations if it[0] <= log.last_admission_ms]
    assert all(it[1] == 4 for it in full_until)
    for r in stream:
        assert log.output[r.index] == replay(r.table, parse_strategy("static:3"), 24).output_ids
    assert sum(r["tokens"] for r in log.requests) == sum(it[2] for it in log.iterations)


def test_flat_profile_makes_a_batch_free():
    tables = [synthetic_table(s) for s in range(3)]
    stream = request_stream(tables, 24, seed=1)
    one = metrics(simulate("autoregressive", stream, 1, Pricer(FlatBatch(0.1), "ragged"), 24), whole=True)
    eight = metrics(simulate("autoregressive", stream, 8, Pricer(FlatBatch(0.1), "ragged"), 24), whole=True)
    assert eight["tokens_per_s"] > 5 * one["tokens_per_s"]


def test_poisson_arrivals_wait_for_their_time():
    tables = [synthetic_table(0)]
    stream = request_stream(tables, 6, seed=0, rate_per_s=0.5)
    assert all(b.arrival_ms > a.arrival_ms for a, b in zip(stream, stream[1:]))
    log = simulate("static:2", stream, 4, Pricer(FlatBatch(0.0, 10.0), "ragged"), 24)
    for r in log.requests:
        assert r["first_ms"] > r["arrival_ms"]
    m = metrics(log, open_loop=True)
    assert m["ttft_ms_p50"] > 0 and m["tpot_ms_p50"] > 0


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
def test_bad_rates_and_streams_are_refused(rate):
    with pytest.raises(BatchReplayError):
        request_stream([synthetic_table(0)], 3, 0, rate_per_s=rate)
    with pytest.raises(BatchReplayError):
        request_stream([], 3, 0)


# -- policy state in a batch -----------------------------------------------------------------------------------------

def test_shared_policy_state_is_one_object_per_batch_and_per_sequence_state_is_not():
    shared = Setting("sglang:3")
    assert shared.shared and shared.policy() is shared.policy()
    per = Setting("threshold:0.4:20")
    assert not per.shared and per.policy() is not per.policy()


def test_shared_state_learns_from_every_sequence():
    tables = [synthetic_table(s, n_out=40, depth=40) for s in range(4)]
    stream = request_stream(tables, 8, seed=2)
    setting = Setting("sglang:3")
    log = simulate(setting, stream, 4, Pricer(FlatBatch(0.1), "ragged"), 40)
    assert len(log.requests) == 8
    for r in stream:  # shared state changes the depths, never the greedy output
        assert log.output[r.index] == r.table.reference_for(40)[: len(log.output[r.index])]


def test_batch_stop_drafts_one_depth_for_the_batch_and_keeps_outputs():
    tables = [synthetic_table(s) for s in range(3)]
    stream = request_stream(tables, 9, seed=5)
    pricer = Pricer(TokenCurve(CURVE), "padded-max")
    log = simulate("batchstop:10", stream, 3, pricer, 24)
    for r in stream:
        assert log.output[r.index] == r.table.reference_for(24)[: len(log.output[r.index])]
    # free drafting: the rule drafts deep; drafting as dear as verifying: it stops early
    deep = simulate("batchstop:10", stream, 3, Pricer(FlatBatch(0.0), "ragged"), 24)
    shallow = simulate("batchstop:10", stream, 3, Pricer(FlatBatch(1.0), "ragged"), 24)
    assert len(deep.iterations) < len(shallow.iterations)


def test_settings_parse_and_refuse():
    assert Setting("batchstop:8").spec == "batchstop:8"
    for bad in ("batchstop:x", "batchstop:0", "oracle:20"):
        with pytest.raises(BatchReplayError):
            Setting(bad)


def test_steady_window_excludes_ramp_up_and_drain():
    tables = [synthetic_table(s, n_out=8 + 2 * s) for s in range(6)]
    stream = request_stream(tables, 40, seed=4)
    log = simulate("static:2", stream, 4, Pricer(FlatBatch(0.1), "ragged"), 24)
    m = metrics(log)
    assert m["steady"] and 0 < m["window_ms"] < log.iterations[-1][0]
    assert m["mean_active"] == pytest.approx(4.0)
    # closed loop: TTFT counts from admission to a slot (a request's first iteration), not from time 0
    assert m["ttft_ms_p99"] <= max(it[3] + it[4] for it in log.iterations) + 1e-9
    assert not math.isnan(m["tpot_ms_p99"])


def test_a_race_recosted_as_in_a_batch():
    import pandas as pd

    from disco.decode.trace import iterations_frame
    from disco.replay.recost import recost_trace

    table = synthetic_table(7)
    records = []
    for spec in ("autoregressive", "static:3"):
        records += replay(table, parse_strategy(spec), 24, costs=CURVE).records
    frame = iterations_frame(records)
    one = {r["strategy"]: r for r in recost_trace(frame, 1, Pricer(TokenCurve(CURVE), "ragged"))}
    for spec in ("autoregressive", "static:3"):  # at B = 1 the lane's own modelled time
        lane = frame[frame["strategy"] == spec]
        assert one[spec]["predicted_ms"] == pytest.approx(lane["iteration_ms"].sum())
    assert one["autoregressive"]["speedup"] == 1.0
    flat1 = {r["strategy"]: r for r in recost_trace(frame, 1, Pricer(FlatBatch(0.1), "ragged"))}
    flat8 = {r["strategy"]: r for r in recost_trace(frame, 8, Pricer(FlatBatch(0.1), "ragged"))}
    for spec in ("autoregressive", "static:3"):  # a flat profile makes a batch free: 8 sequences, 8 times the tokens
        assert flat8[spec]["tokens_per_s"] == pytest.approx(8 * flat1[spec]["tokens_per_s"])
    for bad in (frame.drop(columns=["draft_calls"]), frame.assign(target_tokens=-1)):
        with pytest.raises(BatchReplayError):
            recost_trace(bad, 2, Pricer(FlatBatch(0.1), "ragged"))
    assert isinstance(pd.DataFrame(list(flat8.values())), pd.DataFrame)


def test_cached_iterations_give_the_same_run_as_live_stepping():
    tables = [synthetic_table(s) for s in range(4)]
    stream = request_stream(tables, 20, seed=9)
    for spec in ("static:3", "threshold:0.4:20", "pmin:0.5:16:2"):
        assert Setting(spec).cacheable
        pricer = Pricer(TokenCurve(CURVE), "padded-k")
        traces: dict = {}
        cached = simulate(spec, stream, 4, pricer, 24, traces=traces)
        again = simulate(spec, stream, 4, pricer, 24, traces=traces)  # now every request's iterations come from traces
        live = simulate(spec, stream, 4, pricer, 24)
        assert cached.iterations == again.iterations == live.iterations
        assert cached.output == live.output
    assert not Setting("sglang:3").cacheable and not Setting("batchstop:8").cacheable
    assert not Setting("costaware:20").cacheable


def test_a_cached_context_is_priced_on_every_pass_and_changes_nothing_else():
    """``Pricer(context=C)``: every sequence holds C more cached tokens. Under a roofline every pass reads them (the
    run takes longer); the schedule, the outputs and what each iteration emits stay the tables'; a source that prices
    no context (flat:C) gives the same clock."""
    from disco.costs.roofline import roofline_costs

    tables = [synthetic_table(s) for s in range(3)]
    stream = request_stream(tables, 6, 0)
    costs = roofline_costs("roofline:h100")
    near = simulate("static:3", stream, 4, Pricer(costs, "ragged"), 24)
    far = simulate("static:3", stream, 4, Pricer(costs, "ragged", 16384), 24)
    assert near.output == far.output
    assert [it[1:3] for it in near.iterations] == [it[1:3] for it in far.iterations]
    assert far.iterations[-1][0] > near.iterations[-1][0]
    assert all(b[3] + b[4] > a[3] + a[4] for a, b in zip(near.iterations, far.iterations))
    flat = [simulate("static:3", stream, 4, Pricer(FlatBatch(0.1), "ragged", c), 24).iterations for c in (0, 16384)]
    assert flat[0] == flat[1]
    for bad in (-1, 1.5, "many", float("inf"), 1 << 21):
        with pytest.raises(LayoutError):
            Pricer(costs, "ragged", bad)


def _equal_split_reference(rows, ubatch):
    """llama.cpp's split_equal as first written here (a plain scan each round), kept to check the faster one."""
    rows = sorted(rows)
    left, fed, passes = [n for _, n, _, _ in rows], [0] * len(rows), []
    while any(left):
        run = [next(i for i, n in enumerate(left) if n > 0)]
        while run[-1] + 1 < len(rows) and left[run[-1] + 1] > 0 and rows[run[-1] + 1][0] == rows[run[-1]][0] + 1:
            run.append(run[-1] + 1)
        take = min(min(left[i] for i in run), max(1, ubatch // len(run)))
        outputs = sum(max(0, min(fed[i] + take, rows[i][1]) - max(fed[i], rows[i][1] - rows[i][3])) for i in run)
        passes.append(([take] * len(run), [rows[i][2] + fed[i] for i in run], outputs))
        for i in run:
            left[i] -= take
            fed[i] += take
    return passes


@pytest.mark.parametrize("ubatch", [7, 2048])
def test_llama_split_equals_a_plain_reference_on_random_batches(monkeypatch, ubatch):
    """The llama-split layout's ubatches on random batches (gaps in the slots, rows with nothing to feed, runs longer
    than the ubatch cap) equal a plain scan of the same rule."""
    from disco.replay import layouts

    monkeypatch.setattr(layouts, "UBATCH", ubatch)
    rng = random.Random(ubatch)
    most = 3000 if ubatch > 100 else 40  # a small cap takes one token a row per ubatch: keep the rounds few
    for _ in range(400):
        slots = sorted(rng.sample(range(80), rng.randint(1, 70)))
        rows = []
        for s in slots:
            n = rng.choice([0, 1, 1, 2, 3, 5, 17, 300]) if rng.random() < 0.9 else rng.randint(0, most)
            n = min(n, most)
            rows.append((s, n, rng.randint(0, 500), rng.randint(1, max(1, n))))
        rng.shuffle(rows)
        assert layouts._equal_split(list(rows)) == _equal_split_reference(list(rows), ubatch)


def test_a_row_moved_to_another_slot_keeps_every_other_field():
    import dataclasses

    row = RowPass(9, 7, 5, 3, 120, 118, True, 6, 2)
    assert row.at(5) == dataclasses.replace(row, slot=5) and row.at(2) is row
