"""``python -m disco profile --batch 1,2,4,8 [--contexts 64,256]``: what a pass over B sequences costs on this machine.

For each multi-sequence layout the pair's engine runs (llama.cpp, ``disco.models.llama_batch``: one KV stream per
sequence, or one unified buffer; torch, ``disco.models.torch_batch``: one padded cache tensor), batch size B and
context C: B sequences are prefilled with C distinct tokens each (timed as one batched
prefill where it fits one ``llama_decode``, ``reps`` times on a fresh context each, as a live run's first pass is: the
``prefill`` rows, context 0), then a pass of k tokens per sequence (k in ``KS``) is timed ``reps`` times (median kept)
on the target and on the assistant, the caches cropped back to C after each. The rows are the cost CSV's (role,
precision, kind, tokens = per row, ms) plus batch, context and layout, so ``--cost-profile FILE.csv`` reads them as a
batched grid (``disco.costs.batched.grid_from_rows``) and a batch-1 reader keeps its batch-1 rows. Each layout is also checked for batch invariance: whether a batched pass's rows are
bit-identical to each sequence fed alone (``rows_match_batch_one``)."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from disco.errors import BenchError
from disco.models import llama_batch, torch_batch
from disco.models.llama_batch import LAYOUTS, N_BATCH, LlamaBatch

KS = (1, 2, 4, 8, 16)
CONTEXTS = (64, 256)
BATCH_CSV_COLUMNS = ["role", "precision", "kind", "tokens", "ms", "batch", "context", "layout"]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(x) for x in rng.integers(min(100, vocab // 2), min(vocab, 30000), size=n)]


class _Engine:
    """How one engine's batched contexts are made: ``new(role, batch, layout, n_ctx_seq)``; ``limit``, the most
    tokens one pass may feed (llama.cpp's batch; None: no limit); ``vocab``; ``same(layout, prompts, k)``, the
    bit-identity check of ``rows_match_batch_one``."""

    def __init__(self, pair):
        self.pair = pair
        if pair.engine == "llamacpp":
            self.layouts, self.limit, self.vocab = LAYOUTS, N_BATCH, pair.target_model.n_vocab
        else:
            self.layouts, self.limit, self.vocab = torch_batch.LAYOUTS, None, int(pair.target.config.vocab_size)

    def new(self, role: str, batch: int, layout: str, n_ctx_seq: int):
        if self.pair.engine == "llamacpp":
            model = self.pair.target_model if role == "target" else self.pair.assistant_model
            return LlamaBatch(model, batch, layout, n_ctx_seq=n_ctx_seq)
        model = self.pair.target if role == "target" else self.pair.assistant
        return torch_batch.TorchBatch(model, batch, self.pair.device, pad_id=self.pair.eos_ids[0])

    @property
    def pads(self) -> bool:
        """Whether the engine's batch pads sequences of different lengths (torch) rather than running them ragged."""
        return self.pair.engine != "llamacpp"

    def same(self, layout: str, prompts: list[list[int]], k: int, padded: bool = False) -> tuple[bool, float]:
        """``rows_match_batch_one`` over ``prompts`` (different lengths). On a padding engine, unless ``padded``, the
        prompts are cut to the shortest first: batching alone, apart from what left-padding and its mask change."""
        if self.pair.engine == "llamacpp":
            return llama_batch.rows_match_batch_one(self.pair.target_model, layout, prompts, k)
        if not padded:
            prompts = [p[:min(map(len, prompts))] for p in prompts]
        return torch_batch.rows_match_batch_one(self.pair.target, self.pair.device, prompts, k, self.pair.eos_ids[0])


def _prefilled(engine: _Engine, role: str, layout: str, batch: int, context: int, n_ctx_seq: int, reps: int, rng):
    """A context whose B sequences hold ``context`` distinct tokens each, and the prefill's ms where it fits one
    pass (llama.cpp: one ``llama_decode``; else None): timed ``reps`` times, each on a fresh context as a live run's
    first pass is (the first decode of a context allocates its buffers), median kept; the last context is returned
    for the steps."""
    prompts = {s: _tokens(rng, context, engine.vocab) for s in range(batch)}
    if engine.limit is not None and batch * context > engine.limit:
        ctx = engine.new(role, batch, layout, n_ctx_seq)
        for s in range(batch):
            ctx.forward({s: prompts[s]})
        return ctx, None
    times, ctx = [], None
    for _ in range(max(1, reps)):
        if ctx is not None:
            ctx.close()
        ctx = engine.new(role, batch, layout, n_ctx_seq)
        _, ms = ctx.forward(prompts)
        times.append(ms)
    return ctx, statistics.median(times)


def _measure_model(engine: _Engine, role: str, precision: str, layout: str, batch: int, context: int, ks, reps: int,
                   rng) -> list[dict]:
    rows = []
    ctx, prefill_ms = _prefilled(engine, role, layout, batch, context, context + max(ks) + 8, reps, rng)
    try:
        if prefill_ms is not None:
            rows.append(dict(role=role, precision=precision, kind="prefill", tokens=context, ms=prefill_ms,
                             batch=batch, context=0, layout=layout))
        for k in ks:
            times = []
            for _ in range(reps):
                _, ms = ctx.forward({s: _tokens(rng, k, engine.vocab) for s in range(batch)}, {s: k for s in range(batch)})
                times.append(ms)
                for s in range(batch):
                    ctx.crop(s, context)
            rows.append(dict(role=role, precision=precision, kind="step", tokens=k, ms=statistics.median(times),
                             batch=batch, context=context, layout=layout))
    finally:
        ctx.close()
    return rows


def measure(pair, batches, contexts=CONTEXTS, ks=KS, layouts=None, reps: int = 3, seed: int = 0,
            progress: bool = True) -> tuple[list[dict], dict]:
    """Batched pass costs of a pair (rows above) in ``layouts`` (default: every layout its engine runs) and, per
    layout, (bit-identical?, largest logit difference); on torch also with left-padded rows (``_Engine.same``)."""
    engine = _Engine(pair)
    layouts = tuple(layouts or engine.layouts)
    unknown = [x for x in layouts if x not in engine.layouts]
    if unknown:
        raise BenchError(f"the {pair.engine} engine has no batch layout {unknown[0]!r}: it runs "
                         f"{', '.join(engine.layouts)}")
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    start = time.perf_counter()
    for layout in layouts:
        for batch in batches:
            for context in contexts:
                for role in ("target", "assistant"):
                    rows += _measure_model(engine, role, pair.assistant_precision if role == "assistant" else "model",
                                           layout, batch, context, ks, reps, rng)
                if progress:
                    _log(f"profile --batch: {layout} B={batch} context {context} done "
                         f"({time.perf_counter() - start:.0f} s)")
    identity = {}
    prompts = [_tokens(rng, 24 + 9 * s, engine.vocab) for s in range(max(2, min(4, max(batches))))]
    for layout in layouts:
        identity[layout] = engine.same(layout, prompts, 4)
        if engine.pads:  # and with the shorter prompts left-padded (a padded engine's batch of real requests)
            identity[f"{layout}, left-padded rows"] = engine.same(layout, prompts, 4, padded=True)
    return rows, identity


def write_csv(rows: list[dict], path) -> None:
    import pandas as pd

    pd.DataFrame(rows, columns=BATCH_CSV_COLUMNS).to_csv(path, index=False)
