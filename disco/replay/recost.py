"""A finished race's lanes "as in a batch of B": each lane's per-iteration trace re-costed as B identical sequences
decoded in lockstep (the Race tab's prediction, ``disco.app.race_batch``), priced by a batched cost source and a
verification layout (``disco.replay.layouts``)."""

from __future__ import annotations

import math

from disco.replay.batched import BatchReplayError
from disco.replay.layouts import Pricer, RowPass


TRACE_COLUMNS = ("strategy", "iteration", "lookahead", "target_tokens", "draft_calls", "assistant_tokens",
                 "max_lookahead", "new_tokens")


def _trace_rows(frame):
    """A per-iteration trace's columns as whole numbers >= 0 (BatchReplayError, one line, for anything else)."""
    missing = [c for c in TRACE_COLUMNS if c not in getattr(frame, "columns", ())]
    if missing:
        raise BatchReplayError(f"not a per-iteration trace: no column(s) {', '.join(missing)}")
    numbers = frame[list(TRACE_COLUMNS[1:])].apply(lambda c: c.map(_whole_or_none))
    if numbers.isna().any().any():
        raise BatchReplayError("a per-iteration trace holds whole numbers >= 0 in its count columns")
    return frame[["strategy"]].join(numbers.astype(int))


def _whole_or_none(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number == int(number) and number >= 0 else None


def recost_trace(frame, batch: int, pricer: Pricer) -> list[dict]:
    """A finished race's lanes "as in a batch of B": each lane's own iterations (its per-iteration trace rows) run by
    ``batch`` identical sequences in lockstep and priced by ``pricer`` (a prediction: the lanes ran alone). One row per
    lane: predicted ms, tokens per second of the batch, and speed-up over the target-alone lane when the race had one."""
    out = []
    for strategy, rows in _trace_rows(frame).groupby("strategy", sort=False):
        rows = rows.sort_values("iteration")
        prompt_len = int(rows.iloc[0]["target_tokens"]) - int(rows.iloc[0]["lookahead"])
        ms, done = 0.0, 0
        for i, r in enumerate(rows.itertuples(index=False)):
            calls = int(r.draft_calls)
            fed = int(r.assistant_tokens) - (calls - 1) if calls else 0
            context = max(prompt_len + done - 1, 0) if i else 0
            draft, verify = pricer.iteration_ms([
                RowPass(int(r.target_tokens), int(r.max_lookahead), calls, fed, context, max(context - 1, 0), i == 0,
                        int(r.lookahead) + 1, slot) for slot in range(batch)])
            ms += draft + verify
            done = int(r.new_tokens)
        out.append({"strategy": strategy, "batch": batch, "predicted_ms": ms,
                    "tokens_per_s": batch * done / ms * 1000.0 if ms > 0 else math.nan})
    base = next((o["tokens_per_s"] for o in out if o["strategy"] == "autoregressive"), math.nan)
    for o in out:
        o["speedup"] = o["tokens_per_s"] / base if base == base else math.nan
    return out
