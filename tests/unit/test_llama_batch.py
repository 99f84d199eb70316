"""llama.cpp with several sequences in one context (disco.models.llama_batch), the live batched decoder
(disco.decode.batch_decoder) and profile --batch's rows, on the tiny GGUF pair: batched rows against each sequence fed
alone, live batched greedy outputs equal to batch 1's, the batched replay's schedule equal to the live one's."""

from __future__ import annotations

import numpy as np
import pytest

from disco.models import llama

if llama.available() is not None:
    pytest.skip(f"llama-cpp-python is not installed: {llama.available()}", allow_module_level=True)

import tiny_gguf  # noqa: E402
from disco.bench import batch_profile  # noqa: E402
from disco.costs.batched import FlatBatch, grid_from_rows  # noqa: E402
from disco.decode.batch_decoder import BatchDecoder  # noqa: E402
from disco.models import encode_prompt, gguf_pair  # noqa: E402
from disco.models.llama_batch import LlamaBatch, LlamaBatchError, rows_match_batch_one  # noqa: E402
from disco.replay.batched import Request, simulate  # noqa: E402
from disco.replay.layouts import Pricer  # noqa: E402
from disco.replay.tables import build_table  # noqa: E402

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "x = [1, 2", "{'a': 1, 'b': [2, 3]}"]


@pytest.fixture(scope="module")
def gguf_tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf-batch")
    target, assistant = tiny_gguf.write_pair(folder)
    pair = gguf_pair.load("tiny-gguf", target, assistant)
    pair.warmup()
    return pair


@pytest.mark.parametrize("layout", ["streams", "unified"])
def test_batched_rows_equal_each_sequence_fed_alone(gguf_tiny, layout):
    prompts = [encode_prompt(gguf_tiny, p, False, 16) for p in PROMPTS]
    same, diff = rows_match_batch_one(gguf_tiny.target_model, layout, prompts, 3)
    if layout == "streams":  # one KV stream per sequence, exact kernels: the rows of one sequence alone
        assert same, diff
    assert diff < 1e-3  # unified: same maths over a masked shared cache; any difference is rounding


def test_crop_and_refeed_gives_the_same_rows(gguf_tiny):
    ids = encode_prompt(gguf_tiny, PROMPTS[0], False, 16)
    ctx = LlamaBatch(gguf_tiny.target_model, 2, "streams", 64)
    try:
        ctx.forward({0: ids, 1: ids[:5]})
        first, _ = ctx.forward({0: [5, 6, 7]}, {0: 3})
        ctx.crop(0, len(ids))
        again, _ = ctx.forward({0: [5, 6, 7]}, {0: 3})
        assert np.array_equal(first[0], again[0])
        assert ctx.lengths == [len(ids) + 3, 5]
        with pytest.raises(LlamaBatchError):
            ctx.forward({1: list(range(100))})
    finally:
        ctx.close()


@pytest.mark.parametrize("spec", ["autoregressive", "static:3", "threshold:0.4:8", "pmin:0.3:6"])
@pytest.mark.parametrize("layout", ["streams", "unified"])
def test_live_batched_greedy_equals_batch_one_and_the_replayed_schedule(gguf_tiny, spec, layout):
    ids = [encode_prompt(gguf_tiny, p, False, 16) for p in PROMPTS]
    tables = [build_table(gguf_tiny, p, 20) for p in ids]
    decoder = BatchDecoder(gguf_tiny, ids, spec, 20, layout)
    try:
        outputs = decoder.run()
    finally:
        decoder.close()
    for out, table in zip(outputs, tables):
        assert out == table.reference_for(20)[: len(out)]
        assert len(out) == 20 or out[-1] in table.eos
    log = simulate(spec, [Request(i, t) for i, t in enumerate(tables)], len(ids), Pricer(FlatBatch(0.1), "ragged"), 20)
    # the same schedule: rows per iteration, tokens sent to the target, draft passes
    assert [it[1] for it in log.iterations] == [it.rows for it in decoder.log]
    assert [it[5] for it in log.iterations] == [sum(it.target_tokens) for it in decoder.log]
    assert [it[6] for it in log.iterations] == [it.draft_passes for it in decoder.log]


def test_the_live_batched_decoder_refuses_a_shared_state_rule(gguf_tiny):
    from disco.errors import InputError

    with pytest.raises(InputError):
        BatchDecoder(gguf_tiny, [[1, 2, 3]], "sglang:3", 8)


def test_profile_batch_rows_read_back_as_a_grid(gguf_tiny):
    rows, identity = batch_profile.measure(gguf_tiny, [1, 2], contexts=(8, 24), ks=(1, 2, 4), reps=1, progress=False)
    assert {r["layout"] for r in rows} == {"streams", "unified"}
    assert {(r["role"], r["kind"]) for r in rows} >= {("target", "step"), ("assistant", "step"), ("target", "prefill")}
    assert identity["streams"][0]
    grid = grid_from_rows([dict(r, batch=str(r["batch"])) for r in rows], "test", layout="streams")
    assert grid.target_ms([2, 2], [16, 16]) > 0 and grid.assistant_ms([1], [8]) > 0


def test_profile_batch_times_each_prefill_on_fresh_contexts(gguf_tiny, monkeypatch):
    """A live run's first pass prefills a fresh context (its first decode allocates the buffers): the profile times
    the prefill the same way, ``reps`` times, and keeps the median (one cold sample put a B = 4 assistant prefill
    at 1.5x its median and the live check's prediction 20 % off)."""
    made, timed = [], []
    real = batch_profile.LlamaBatch

    class Counting(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

        def forward(self, rows, keep=None):
            logits, ms = super().forward(rows, keep)
            if all(self.lengths[s] == len(t) for s, t in rows.items()):  # a prefill: the whole cache is this pass
                timed.append(ms)
            return logits, ms

    monkeypatch.setattr(batch_profile, "LlamaBatch", Counting)
    rows, _ = batch_profile.measure(gguf_tiny, [2], contexts=(8,), ks=(1,), layouts=("streams",), reps=3,
                                    progress=False)
    assert len(made) == 2 * 3  # target and assistant, a fresh context per timing
    prefills = [r for r in rows if r["kind"] == "prefill"]
    assert len(prefills) == 2 and len(timed) == 6
    target = sorted(timed[:3])
    assert prefills[0]["role"] == "target" and prefills[0]["ms"] == target[1]
