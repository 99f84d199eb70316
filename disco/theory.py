"""Leviathan et al. (2023), "Fast Inference from Transformers via Speculative Decoding": the closed forms shown
beside every measurement. With acceptance rate alpha (i.i.d. per drafted token), lookahead gamma and cost ratio
c = t_draft / t_target."""

from __future__ import annotations


def expected_tokens(alpha: float, gamma: float) -> float:
    """Expected tokens per iteration (one target pass): (1 - alpha^(gamma+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def speedup(alpha: float, gamma: float, c: float) -> float:
    """Expected walltime speed-up over autoregressive decoding when verification costs one target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)
