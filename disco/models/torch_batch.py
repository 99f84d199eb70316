"""Several sequences in one transformers forward pass: what a batched pass costs on the torch engine and whether its
rows stay the rows of one sequence alone (``profile --batch`` on ``--engine torch``).

torch has one multi-sequence layout, ``padded``: the B sequences share one KV cache tensor of shape
(B, heads, length, head_dim), so every pass feeds the same number of tokens to every row. Sequences of different
lengths are left-padded in their first pass (the pads masked out by ``attention_mask``, positions counted from each
row's first real token), as ``transformers``' batched ``generate`` does; later passes extend every row alike. This
is the layout of an engine that pads its rows to one length (a CUDA graph's fixed shape); a ragged batch is not
expressible here without per-row caches, which is what llama.cpp's ``streams`` layout is
(``disco.models.llama_batch``).

Whether the rows are bit-identical to batch 1 is measured, not assumed (``rows_match_batch_one``): a matrix product
over B rows may block its reduction differently from one over one row.
"""

from __future__ import annotations

import time

import torch

from disco.errors import UserError
from disco.models.background import in_pass
from disco.models.pair import TorchSession, sync

LAYOUTS = ("padded",)


class TorchBatchError(UserError, ValueError):
    """A batched torch pass that cannot be fed as asked (one line)."""


class TorchBatch:
    """B sequences in one padded KV cache; ``forward({seq: tokens})`` feeds every row the same number of tokens after
    its first pass and returns, per sequence, the float32 logits of its last ``keep`` tokens. The interface is
    ``disco.models.llama_batch.LlamaBatch``'s, so ``profile --batch`` measures either engine alike."""

    layout = "padded"

    def __init__(self, model, n_seq: int, device: torch.device, pad_id: int = 0):
        from transformers import DynamicCache

        self.model, self.n_seq, self.device, self.pad_id = model, int(n_seq), device, int(pad_id)
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros((self.n_seq, 0), dtype=torch.long, device=device)
        self.lengths = [0] * self.n_seq

    def close(self) -> None:
        self.cache = None

    @torch.inference_mode()
    def forward(self, rows: dict[int, list[int]], keep: dict[int, int] | None = None
                ) -> tuple[dict[int, torch.Tensor], float]:
        if self.cache is None:
            raise TorchBatchError("forward() on a closed batched torch context")
        if sorted(rows) != list(range(self.n_seq)) or not all(rows.values()):
            raise TorchBatchError(f"a padded batched pass feeds all {self.n_seq} sequences at least one token each")
        keep = keep or {}
        width = max(len(t) for t in rows.values())
        first = self.mask.shape[1] == 0
        if not first and any(len(t) != width for t in rows.values()):
            raise TorchBatchError("after its first pass a padded batch feeds every sequence the same number of tokens")
        ids = torch.tensor([[self.pad_id] * (width - len(rows[s])) + list(rows[s]) for s in range(self.n_seq)],
                           dtype=torch.long, device=self.device)
        new_mask = torch.tensor([[0] * (width - len(rows[s])) + [1] * len(rows[s]) for s in range(self.n_seq)],
                                dtype=torch.long, device=self.device)
        mask = torch.cat([self.mask, new_mask], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp_min(0)[:, -width:]
        most = max(keep.get(s, 1) for s in range(self.n_seq))
        sync(self.device)
        start = time.perf_counter()
        with in_pass():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=self.cache,
                             use_cache=True, logits_to_keep=most)
        logits = out.logits.float()
        sync(self.device)
        ms = (time.perf_counter() - start) * 1000.0
        self.mask = mask
        for s in range(self.n_seq):
            self.lengths[s] += len(rows[s])
        return {s: logits[s, logits.shape[1] - keep.get(s, 1):] for s in range(self.n_seq)}, ms

    def crop(self, seq: int, length: int) -> None:
        """Roll sequence ``seq`` back to its first ``length`` tokens. One cache tensor holds every row, so the batch
        is cut at that column for all rows: every row must end up at its own ``length`` alike (their pads differ
        only in the first pass)."""
        extra = self.lengths[seq] - int(length)
        if extra <= 0:
            return
        if any(self.lengths[s] - extra < 0 for s in range(self.n_seq)):
            raise TorchBatchError("a padded batch is cropped by the same number of tokens on every row")
        self.cache.crop(-extra)
        self.mask = self.mask[:, :self.mask.shape[1] - extra]
        self.lengths = [n - extra for n in self.lengths]


def rows_match_batch_one(model, device: torch.device, prompts: list[list[int]], k: int, pad_id: int = 0
                         ) -> tuple[bool, float]:
    """Whether a padded batched pass of ``k`` tokens per sequence over ``prompts`` (different lengths: the shorter
    ones left-padded) gives every row bit-identical to the same sequence fed alone; and the largest absolute logit
    difference."""
    alone = []
    for toks in prompts:
        one = TorchSession(model, device)
        one.forward(toks[:-k], 1)
        logits, _ = one.forward(toks[-k:], k)
        alone.append(logits)
    many = TorchBatch(model, len(prompts), device, pad_id)
    many.forward({s: toks[:-k] for s, toks in enumerate(prompts)})
    logits, _ = many.forward({s: toks[-k:] for s, toks in enumerate(prompts)}, {s: k for s in range(len(prompts))})
    diff = max(float((logits[s] - alone[s]).abs().max()) for s in range(len(prompts)))
    return diff == 0.0, diff
