"""How a batch of sequences is laid out for one pass, and what its passes cost: the verification layouts of the
batched replay (``disco.replay.batched``) and the batched drafting loop.

Each row of a batch iteration says how many tokens it sends to the target (``target_tokens``: its catch-up token and
its drafts; its whole prompt on its first iteration), the deepest draft its setting allows (``k_config``), the
tokens its assistant is fed on its first draft step, how many draft steps it ran, and both caches' lengths.

Verification layouts (a row in its first iteration, its prefill, is never padded: engines schedule prefills apart):

``padded-k``     every decoding row padded to the configured ``K + 1`` query tokens: one query length for every row,
                 as full CUDA graphs need (vLLM's, TensorRT-LLM's static draft length);
``padded-max``   padded to the batch's longest draft this iteration (one query length, chosen per iteration);
``graph``        ragged, with the batch's total tokens rounded up to the next captured graph size (vLLM's default
                 capture sizes 1, 2, 4, 8, 16, ... 512; beyond 512 eager, no padding);
``ragged``       every row its own length, no padding: the lower bound of any engine;
``llama-split``  llama.cpp with one KV stream per sequence (``kv_unified`` off): ``split_equal(n_ubatch,
                 sequential=true)`` in src/llama-batch.cpp (vendored 0.3.36) builds each ubatch from a run of
                 *consecutive* sequence ids that still hold tokens, and takes the same count from each (capped by
                 ``UBATCH``); a gap in the ids (a finished slot) starts a new ubatch. One pass per ubatch, drafting
                 passes included.

Drafting: every draft step is one assistant pass over **all** the batch's drafting rows (a row that stopped still
occupies its slot, as batched engines run it), so an iteration drafts as deep as its deepest drafter; the first step
is ragged (each row catches up on the 1-2 tokens it has not seen, a new row on its prompt).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

from disco.costs.batched import BatchCosts
from disco.errors import InputError

LAYOUTS = ("padded-k", "padded-max", "graph", "ragged", "llama-split")
UBATCH = 2048  # llama.cpp's n_ubatch in disco.models.llama_batch (a test keeps the two equal)
CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 256, 8)) + tuple(range(256, 513, 16))  # vLLM's default capture list


class LayoutError(InputError):
    """An unknown verification layout."""


def check_layout(name: str) -> str:
    name = str(name).strip()
    if name not in LAYOUTS:
        raise LayoutError(f"unknown layout {name!r}: expected one of {', '.join(LAYOUTS)}")
    return name


def check_context(value) -> int:
    """A cached context per sequence: a whole number of tokens in 0..``Pricer.MAX_CONTEXT`` (one line otherwise)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LayoutError(f"context {value!r} is not a whole number of tokens") from None
    if not (math.isfinite(number) and number == int(number) and 0 <= number <= Pricer.MAX_CONTEXT):
        raise LayoutError(f"context {value!r}: expected a whole number of tokens from 0 to {Pricer.MAX_CONTEXT}")
    return int(number)


@dataclass(frozen=True)
class RowPass:
    """One sequence's share of one batch iteration (from its own replayed iteration record)."""

    target_tokens: int    # tokens it sends to the target (1 + drafts while decoding; prompt + drafts when new)
    k_config: int         # the deepest draft its setting allows (its padded query length is k_config + 1)
    draft_calls: int      # assistant passes it ran this iteration
    first_fed: int        # tokens its first draft step fed the assistant (catch-up, or the prompt when new)
    target_context: int   # tokens in its target cache before the pass
    assistant_context: int
    prefill: bool         # its first iteration: the prompt is in this pass
    outputs: int = 0      # positions whose logits verification reads (drafts + 1); 0: every token it sends
    slot: int = 0         # its place in the batch (llama.cpp's sequence id)

    @property
    def logits(self) -> int:
        return self.outputs or self.target_tokens

    def at(self, slot: int) -> "RowPass":
        """This row in batch slot ``slot`` (the batched replay's hot path: a plain constructor call, several times
        faster than ``dataclasses.replace``)."""
        if slot == self.slot:
            return self
        return RowPass(self.target_tokens, self.k_config, self.draft_calls, self.first_fed, self.target_context,
                       self.assistant_context, self.prefill, self.outputs, slot)


def verify_passes(layout: str, rows: Sequence[RowPass]) -> list[tuple[list[int], list[int], int]]:
    """The target passes (query tokens per row, contexts, rows that need logits) one batch iteration's verification
    takes in ``layout``; logits are read only where verification needs them (every layout: the LM head runs on the
    selected positions, padding is never read)."""
    outputs = sum(r.logits for r in rows)
    new = [(r.target_tokens, r.target_context) for r in rows if r.prefill]
    old = [r for r in rows if not r.prefill]
    if layout == "llama-split":
        return _equal_split([(r.slot, r.target_tokens, r.target_context, r.logits) for r in rows])
    if layout == "padded-k":
        lengths = [max(r.k_config + 1, r.target_tokens) for r in old]
    elif layout == "padded-max":
        longest = max((r.target_tokens for r in old), default=0)
        lengths = [longest] * len(old)
    else:
        lengths = [r.target_tokens for r in old]
    tokens = lengths + [n for n, _ in new]
    contexts = [r.target_context for r in old] + [c for _, c in new]
    if layout == "graph" and tokens:
        total = sum(tokens)
        i = bisect.bisect_left(CAPTURE_SIZES, total)
        if i < len(CAPTURE_SIZES) and CAPTURE_SIZES[i] > total:  # pad tokens ride as one extra row with no context
            tokens, contexts = tokens + [CAPTURE_SIZES[i] - total], contexts + [0]
    return [(tokens, contexts, outputs)] if tokens else []


def _equal_split(rows: list[tuple[int, int, int, int]]) -> list[tuple[list[int], list[int], int]]:
    """llama.cpp's ubatches for rows (slot, tokens, context, logits rows) with one KV stream per sequence: each from
    the run of consecutive slots, starting at the first that still holds tokens, taking the same count from each
    (at most ``UBATCH`` in all); contexts grow by what earlier ubatches fed; a row's logits are its last tokens."""
    rows = sorted(rows)
    m = len(rows)
    left = [n for _, n, _, _ in rows]
    fed = [0] * m
    first_out = [n - logits for _, n, _, logits in rows]  # a row's logits rows are its last ones
    passes = []
    start = 0  # the first row that still holds tokens: the rows before it are done and stay done
    while True:
        while start < m and left[start] <= 0:
            start += 1
        if start == m:
            return passes
        end = start + 1
        while end < m and left[end] > 0 and rows[end][0] == rows[end - 1][0] + 1:
            end += 1
        take = min(min(left[start:end]), max(1, UBATCH // (end - start)))
        outputs = 0
        for i in range(start, end):  # count the row's logits rows inside [fed, fed + take)
            outputs += max(0, min(fed[i] + take, rows[i][1]) - max(fed[i], first_out[i]))
        passes.append(([take] * (end - start), [rows[i][2] + fed[i] for i in range(start, end)], outputs))
        for i in range(start, end):
            left[i] -= take
            fed[i] += take


def draft_passes(rows: Sequence[RowPass], layout: str = "ragged") -> list[tuple[list[int], list[int], int]]:
    """The assistant passes of one batch iteration: as many as its deepest drafter ran, each over every drafting row
    (the first ragged with each row's catch-up, the others one token a row), one row of logits each; in
    ``llama-split`` each pass is split into llama.cpp's ubatches."""
    drafting = [r for r in rows if r.draft_calls > 0]
    depth = max((r.draft_calls for r in drafting), default=0)
    passes = []
    for j in range(depth):
        fed = [r.first_fed if j == 0 else 1 for r in drafting]
        ctx = [r.assistant_context + (0 if j == 0 else r.first_fed + j - 1) for r in drafting]
        if layout == "llama-split":
            passes += _equal_split([(r.slot, n, c, 1) for r, n, c in zip(drafting, fed, ctx)])
        else:
            passes.append((fed, ctx, len(drafting)))
    return passes


class Pricer:
    """A batch iteration's cost under one cost source and layout, memoised on the passes' shapes (contexts rounded to
    ``CONTEXT_STEP`` tokens, spread evenly over the rows) so a long replay prices each shape once.

    ``context``: tokens every sequence already holds in both caches before its prompt (a prefix cached before the
    request came, e.g. a long shared document or an agent's history): every pass reads them, none prefills them. It
    asks what the decode costs at that context length; what the sequences accept stays their tables'."""

    CONTEXT_STEP = 16
    MAX_CONTEXT = 1 << 20

    def __init__(self, costs: BatchCosts, layout: str, context: int = 0):
        self.costs = costs
        self.layout = check_layout(layout)
        self.context = check_context(context)
        self._memo: dict[tuple, float] = {}

    def _pass(self, role: str, tokens: list[int], contexts: list[int], outputs: int) -> float:
        mean = sum(contexts) / len(contexts) + self.context
        ctx = int(round(mean / self.CONTEXT_STEP)) * self.CONTEXT_STEP
        key = (role, tuple(sorted(tokens)), ctx, outputs)
        ms = self._memo.get(key)
        if ms is None:
            fn = self.costs.target_ms if role == "target" else self.costs.assistant_ms
            ms = self._memo[key] = float(fn(list(key[1]), [ctx] * len(tokens), outputs))
        return ms

    def draft_ms(self, rows: Sequence[RowPass]) -> float:
        return sum(self._pass("assistant", t, c, o) for t, c, o in draft_passes(rows, self.layout))

    def verify_ms(self, rows: Sequence[RowPass]) -> float:
        return sum(self._pass("target", t, c, o) for t, c, o in verify_passes(self.layout, rows))

    def iteration_ms(self, rows: Sequence[RowPass]) -> tuple[float, float]:
        """(drafting ms, verification ms) of one batch iteration."""
        return self.draft_ms(rows), self.verify_ms(rows)
