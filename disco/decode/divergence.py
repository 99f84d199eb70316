"""Why two greedy runs of the same target can differ: a near-tie that rounding flipped, or a real mismatch.

Speculative greedy decoding must emit exactly the target's own greedy tokens. In exact arithmetic it does; in
bf16 the target's logits for the same position come out slightly differently when the target verifies 1 token
(autoregressive) or 8 at once (a speculative lane): different matmul shapes round differently. Where two tokens
are almost tied, the two runs can pick different ones, and from there their texts part. That is not a bug, but a
reader of "identical: NO" cannot tell it from one, so every divergence is explained from the trace:

  * the first differing position p, the baseline's token a and the lane's token b;
  * the target's logits for a and b at p as each run computed them (every token record keeps its own logit and
    the runner-up's: ``TokenRecord.target_logit`` / ``runner_up_id`` / ``runner_up_logit``);
  * the margin each run had for its own choice: baseline l_base(a) - l_base(b), lane l_lane(b) - l_lane(a).

Rule (stated in the app and in docs/cli.md): a divergence is a **near-tie** when both margins are within
``ULPS`` units in the last place of the dtype at the logits' magnitude, ``ULPS * 2**-(mantissa bits) *
max(1, |logit|)`` (bf16: 7 stored mantissa bits, so 4 ulps at a logit of 20 is 0.625); otherwise a **mismatch**,
which is a bug to fix. When a run's runner-up is not the other run's token, that run's margin is at least its
top-1 - top-2 gap (reported as such), and it is classified a mismatch: the tokens were not the two best.
"""

from __future__ import annotations

import math

ULPS = 4
MANTISSA_BITS = {"bf16": 7, "fp16": 10, "fp32": 23}
NEAR_TIE = "near-tie"
MISMATCH = "mismatch"
RULE = (f"near-tie when both runs' margins are within {ULPS} ulps of the dtype at the logits' magnitude "
        f"({ULPS} x 2^-mantissa_bits x max(1, |logit|)); otherwise mismatch")


def tolerance(dtype: str, magnitude: float) -> float:
    bits = MANTISSA_BITS.get(dtype, 23)
    return ULPS * 2.0 ** -bits * max(1.0, abs(magnitude))


def _logit_of(record, token: int) -> tuple[float, bool]:
    """(logit of ``token`` in this run at this position, exact?) from one token record: its own token or its
    runner-up exactly; otherwise the runner-up's logit, an upper bound."""
    if record.token_id == token:
        return record.target_logit, True
    if record.runner_up_id == token:
        return record.runner_up_logit, True
    return record.runner_up_logit, False


def explain(base_tokens: list, lane_tokens: list, dtype: str) -> dict | None:
    """The first divergence between two runs' token records (baseline, lane), or None if one is a prefix of the
    other (same tokens as far as both go)."""
    for p, (b_rec, l_rec) in enumerate(zip(base_tokens, lane_tokens)):
        if b_rec.token_id != l_rec.token_id:
            break
    else:
        return None
    a, b = b_rec.token_id, l_rec.token_id
    base_a, _ = b_rec.target_logit, True
    base_b, base_exact = _logit_of(b_rec, b)
    lane_b = l_rec.target_logit
    lane_a, lane_exact = _logit_of(l_rec, a)
    margin_base, margin_lane = base_a - base_b, lane_b - lane_a
    tol = tolerance(dtype, max(abs(base_a), abs(lane_b)))
    finite = all(math.isfinite(x) for x in (margin_base, margin_lane))
    exact = base_exact and lane_exact
    kind = NEAR_TIE if exact and finite and margin_base <= tol and margin_lane <= tol else MISMATCH
    return {
        "position": p, "kind": kind, "dtype": dtype, "tolerance": tol, "rule": RULE,
        "baseline_token": a, "lane_token": b, "baseline_text": b_rec.text, "lane_text": l_rec.text,
        "baseline_logits": {"baseline_token": base_a, "lane_token": base_b if base_exact else None},
        "lane_logits": {"baseline_token": lane_a if lane_exact else None, "lane_token": lane_b},
        "baseline_margin": margin_base, "lane_margin": margin_lane,
        "margins_exact": exact,
    }


def short(div: dict | None) -> str:
    """One phrase for tables: ``near-tie at token 37 ('x' vs 'y', margins 0.06 / 0.03)``."""
    if not div:
        return ""
    bound = "" if div["margins_exact"] else " at least"
    return (f"{div['kind']} at token {div['position']} ({div['baseline_text']!r} vs {div['lane_text']!r}, margins"
            f"{bound} {div['baseline_margin']:.3g} / {div['lane_margin']:.3g}, tolerance {div['tolerance']:.3g})")
