"""Several sequences in one llama.cpp context, fed together: what a batched pass costs here and whether its rows stay
the rows of one sequence alone (``profile --batch``; the live batched check of ``disco.bench.batch_live``).

llama.cpp runs B sequences in one context (``n_seq_max = B``) in two ways, chosen when the context is made:

``streams``  (``kv_unified`` off) one KV stream per sequence; a batch whose sequences bring different token counts is
             split into ubatches that take the same count from each (``llama_batch_allocr::split_equal`` in
             src/llama-batch.cpp, read in the vendored 0.3.36 tree), and each sequence attends only to its own stream;
``unified``  (``kv_unified`` on) one KV buffer for all: a batch is one ubatch (``split_simple``) and every query is
             masked over the shared cache.

Exact mode (``disco.models.llama``: no repacked weights, no tiled K-quant matmul, no flash attention) is kept; whether
the rows are then bit-identical to batch 1 is measured, not assumed (``rows_match_batch_one``).
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from disco.errors import UserError
from disco.models.background import in_pass
from disco.models.llama import LlamaModel

LAYOUTS = ("streams", "unified")
N_BATCH = 2048


class LlamaBatchError(UserError, RuntimeError):
    """A batched llama.cpp context that cannot be made or fed (one line)."""


class LlamaBatch:
    """B sequences' caches in one context; ``forward({seq: tokens})`` feeds them in one ``llama_decode`` (llama.cpp
    splits it into ubatches as its layout says) and returns, per sequence, the logits of its last ``keep`` tokens."""

    def __init__(self, model: LlamaModel, n_seq: int, layout: str = "streams", n_ctx_seq: int = 1024):
        if layout not in LAYOUTS:
            raise LlamaBatchError(f"unknown llama.cpp batch layout {layout!r}: expected {' or '.join(LAYOUTS)}")
        lib = model.lib
        self.model, self.lib, self.n_seq, self.layout = model, lib, int(n_seq), layout
        params = lib.llama_context_default_params()
        params.n_ctx = int(n_ctx_seq) * self.n_seq
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = self.n_seq
        params.kv_unified = layout == "unified"
        params.n_threads = params.n_threads_batch = model.n_threads
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_DISABLED if model.exact
                                  else lib.LLAMA_FLASH_ATTN_TYPE_AUTO)
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(model.model, params)
        if not self.ctx:
            raise LlamaBatchError(f"llama.cpp could not make a context for {self.n_seq} sequences of {n_ctx_seq} tokens "
                                  f"({layout}); out of memory?")
        self.n_ctx_seq = int(n_ctx_seq)
        self.lengths = [0] * self.n_seq
        self._batch = lib.llama_batch_init(N_BATCH, 0, 1)
        self._finalizer = weakref.finalize(self, _free, lib, self.ctx, self._batch)

    def close(self) -> None:
        self._finalizer()
        self.ctx = None

    def forward(self, rows: dict[int, list[int]], keep: dict[int, int] | None = None) -> tuple[dict[int, np.ndarray], float]:
        """Feed each sequence its tokens (sequences in increasing order, as the streams layout needs); return the
        float32 logits of each one's last ``keep[seq]`` tokens (default 1) and the pass's ms."""
        if self.ctx is None:
            raise LlamaBatchError("forward() on a closed batched context")
        keep = keep or {}
        order = sorted(s for s, toks in rows.items() if toks)
        total = sum(len(rows[s]) for s in order)
        if total > N_BATCH:
            raise LlamaBatchError(f"a batched pass of {total} tokens exceeds {N_BATCH}")
        lib, batch = self.lib, self._batch
        wanted: list[tuple[int, int]] = []  # (seq, batch index) of each row whose logits are read
        i = 0
        for s in order:
            toks = rows[s]
            if self.lengths[s] + len(toks) > self.n_ctx_seq:
                raise LlamaBatchError(f"sequence {s} would exceed its {self.n_ctx_seq}-token cache")
            first_kept = len(toks) - keep.get(s, 1)
            for j, token in enumerate(toks):
                batch.token[i] = int(token)
                batch.pos[i] = self.lengths[s] + j
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = s
                batch.logits[i] = 1 if j >= first_kept else 0
                if j >= first_kept:
                    wanted.append((s, i))
                i += 1
        batch.n_tokens = i
        start = time.perf_counter()
        with in_pass():
            rc = lib.llama_decode(self.ctx, batch)
        if rc != 0:
            raise LlamaBatchError(f"llama_decode failed with code {rc} on a batch of {len(order)} sequences")
        out: dict[int, list[np.ndarray]] = {s: [] for s in order}
        for s, idx in wanted:
            ptr = lib.llama_get_logits_ith(self.ctx, idx)
            out[s].append(np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy())
        ms = (time.perf_counter() - start) * 1000.0
        for s in order:
            self.lengths[s] += len(rows[s])
        return {s: np.stack(v) for s, v in out.items()}, ms

    def crop(self, seq: int, length: int) -> None:
        """Remove sequence ``seq``'s cached positions from ``length`` on."""
        if length < self.lengths[seq]:
            self.lib.llama_memory_seq_rm(self.lib.llama_get_memory(self.ctx), int(seq), int(length), -1)
            self.lengths[seq] = int(length)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        self.lengths = [0] * self.n_seq


def _free(lib, ctx, batch) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)


def rows_match_batch_one(model: LlamaModel, layout: str, prompts: list[list[int]], k: int) -> tuple[bool, float]:
    """Whether a batched pass of ``k`` tokens per sequence over ``prompts`` (one per sequence, already different
    lengths) gives every row bit-identical to the same sequence fed alone; and the largest absolute logit difference."""
    alone = []
    for toks in prompts:
        one = LlamaBatch(model, 1, "streams", n_ctx_seq=len(toks) + k + 8)
        try:
            one.forward({0: toks[:-k]})
            logits, _ = one.forward({0: toks[-k:]}, {0: k})
            alone.append(logits[0])
        finally:
            one.close()
    many = LlamaBatch(model, len(prompts), layout, n_ctx_seq=max(map(len, prompts)) + 8)
    try:
        many.forward({s: toks[:-k] for s, toks in enumerate(prompts)})
        logits, _ = many.forward({s: toks[-k:] for s, toks in enumerate(prompts)}, {s: k for s in range(len(prompts))})
    finally:
        many.close()
    diff = max(float(np.abs(logits[s] - alone[s]).max()) for s in range(len(prompts)))
    return diff == 0.0, diff
