"""The trace: one record per iteration and one per emitted token, for every strategy.

Every number the UI shows, every plot and every CSV is derived from these records, so they carry
everything needed and nothing is computed anywhere else from model internals.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import pandas as pd

from disco.decode.acceptance import summary_columns
from disco.decode.stops import (  # noqa: F401  (re-exported: the trace's stop_reason values)
    STOP_CONFIDENCE, STOP_EOS, STOP_LENGTH, STOP_MAX_LOOKAHEAD, STOP_NONE, STOP_ORACLE, STOP_REASONS, STOP_SHORT,
    STOP_SOURCE,
)

# token sources
SOURCE_DRAFT = "accepted_draft"
SOURCE_CORRECTION = "target_correction"
SOURCE_BONUS = "target_bonus"
SOURCE_AUTOREGRESSIVE = "autoregressive"


@dataclass
class IterationRecord:
    """One draft -> verify -> accept iteration of one strategy."""

    strategy: str
    iteration: int            # 1-based; iteration 1 includes the prompt's prefill
    lookahead: int            # tokens drafted and sent for verification
    accepted: int             # drafted tokens the target accepted
    emitted: int              # tokens appended to the output (accepted + the target's own, minus EOS/length cuts)
    stop_reason: str
    min_confidence: float     # minimum confidence over the drafted tokens (nan when nothing was drafted)
    threshold: float          # confidence threshold in force (nan when the policy has none)
    max_lookahead: int        # K in force this iteration (0 for autoregressive)
    draft_ms: float           # assistant forward passes + drafting logic
    verify_ms: float          # target forward pass + acceptance
    iteration_ms: float       # whole iteration, as charged to this strategy
    elapsed_ms: float         # this strategy's own cumulative time after this iteration
    new_tokens: int           # output length after this iteration
    target_tokens: int        # tokens fed to the target in its pass (prompt + drafts on iteration 1)
    draft_calls: int          # assistant forward passes this iteration (includes a dropped oracle probe)
    assistant_tokens: int     # tokens fed to the assistant in them (the first pass catches up, each other feeds one)
    forward_ms: float         # time spent inside the two models' forward passes (the rest is engine overhead)
    confidences: list[float] = field(default_factory=list)  # each drafted token's confidence, in order
    assistant_precision: str = "none"  # the assistant this lane drafted with: model | int8 | q4_0 (none: no assistant)
    drafter: str = "assistant"         # what drafted: assistant | lookup (copied from the context) | none

    @property
    def mean_confidence(self) -> float:
        return sum(self.confidences) / len(self.confidences) if self.confidences else math.nan


@dataclass
class TokenRecord:
    """One emitted token."""

    strategy: str
    position: int             # 0-based index in the generated output
    token_id: int
    text: str
    source: str               # accepted_draft | target_correction | target_bonus | autoregressive
    draft_prob: float         # the assistant's confidence when it drafted this token (nan otherwise)
    iteration: int
    target_logit: float = math.nan   # the target's logit for this token, as this run computed it
    runner_up_id: int = -1           # the target's second-ranked token at this position in this run
    runner_up_logit: float = math.nan  # ... and its logit (explains a divergence: see disco.decode.divergence)


ITERATION_COLUMNS = [f.name for f in fields(IterationRecord)]
TOKEN_COLUMNS = [f.name for f in fields(TokenRecord)]


def iterations_frame(records: list[IterationRecord]) -> pd.DataFrame:
    """Per-iteration DataFrame; confidences become a space-separated string (CSV friendly)."""
    rows = []
    for r in records:
        row = asdict(r)
        row["confidences"] = " ".join(f"{c:.4f}" for c in r.confidences)
        row["mean_confidence"] = r.mean_confidence
        rows.append(row)
    columns = [c for c in ITERATION_COLUMNS if c != "confidences"] + ["mean_confidence", "confidences"]
    return pd.DataFrame(rows, columns=columns)


def tokens_frame(records: list[TokenRecord]) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in records], columns=TOKEN_COLUMNS)


def parse_confidences(cell) -> list[float]:
    """Inverse of the CSV encoding of ``confidences``."""
    if not isinstance(cell, str) or not cell.strip():
        return []
    return [float(x) for x in cell.split()]


def summarize(strategy: str, frame: pd.DataFrame) -> dict:
    """Run summary of one strategy from its per-iteration rows (works on a live, partial trace too). After its own
    columns come the engines' headline figures (``disco.decode.acceptance.SUMMARY_COLUMNS``: vLLM's acceptance rate
    and mean acceptance length, llama.cpp's accept %, SGLang's accept length; docs/glossary.md defines them)."""
    rows = frame[frame["strategy"] == strategy] if "strategy" in frame else frame
    if rows.empty:
        return {"strategy": strategy, "new_tokens": 0, "seconds": 0.0, "tokens_per_s": 0.0, "iterations": 0,
                "target_calls": 0, "draft_calls": 0, "drafted": 0, "accepted": 0, "acceptance_rate": math.nan,
                "mean_lookahead": math.nan, "ttft_ms": math.nan, "decode_tokens_per_s": math.nan,
                "overhead_pct": math.nan, **summary_columns(rows)}
    new_tokens = int(rows["new_tokens"].iloc[-1])
    seconds = float(rows["elapsed_ms"].iloc[-1]) / 1000.0
    drafted = int(rows["lookahead"].sum())
    accepted = int(rows["accepted"].sum())
    speculative = rows["stop_reason"] != STOP_NONE
    first = rows.iloc[0]
    decode_ms = float(rows["elapsed_ms"].iloc[-1] - first["elapsed_ms"])
    decode_tokens = new_tokens - int(first["new_tokens"])
    total_ms = float(rows["iteration_ms"].sum())
    return {
        "strategy": strategy,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "tokens_per_s": new_tokens / seconds if seconds > 0 else math.nan,
        "iterations": len(rows),
        "target_calls": len(rows),  # exactly one target pass per iteration
        "draft_calls": int(rows["draft_calls"].sum()),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else math.nan,
        "mean_lookahead": float(rows.loc[speculative, "lookahead"].mean()) if speculative.any() else 0.0,
        "ttft_ms": float(first["elapsed_ms"]),
        "decode_tokens_per_s": decode_tokens / (decode_ms / 1000.0) if decode_ms > 0 else math.nan,
        "overhead_pct": 100.0 * (total_ms - float(rows["forward_ms"].sum())) / total_ms if total_ms > 0 else math.nan,
        **summary_columns(rows),
    }


POSITION_COLUMNS = ["strategy", "position", "reached", "accepted", "rate"]


def position_acceptance(frame: pd.DataFrame, group: str = "strategy") -> pd.DataFrame:
    """Per-position conditional acceptance of each ``group`` (a lane): for draft position i (1-based), ``reached`` is
    how many drafts had an i-th token *and* had their first i - 1 tokens accepted, ``accepted`` how many of those had
    the i-th accepted too, ``rate`` their ratio (what vLLM's ``num_accepted_tokens_per_pos`` and llama.cpp's
    per-position statistics report, conditioned). From the iteration rows only (``lookahead``, ``accepted``)."""
    rows = []
    if frame is None or frame.empty:
        return pd.DataFrame(rows, columns=[group, *POSITION_COLUMNS[1:]])
    for key, part in frame.groupby(group, sort=False):
        drafted = part["lookahead"].to_numpy()
        accepted = part["accepted"].to_numpy()
        for i in range(1, int(drafted.max(initial=0)) + 1):
            reached = int(((drafted >= i) & (accepted >= i - 1)).sum())
            if reached == 0:
                break
            ok = int((accepted >= i).sum())
            rows.append({group: key, "position": i, "reached": reached, "accepted": ok, "rate": ok / reached})
    return pd.DataFrame(rows, columns=[group, *POSITION_COLUMNS[1:]])
