"""The numerics every live backend shares: the draft distribution after the logits processors, the features a
policy sees of it, greedy acceptance and the Leviathan et al. rejection rule (float32 torch tensors)."""

from __future__ import annotations

import torch

from disco.decode.settings import DecodeSettings


def distribution(logits: torch.Tensor, settings: DecodeSettings) -> torch.Tensor:
    """Probabilities after the logits processors (temperature, top-p), in float32, along the last dim.

    Greedy uses the raw distribution: confidence is then the model's plain softmax probability,
    as in transformers (whose greedy assistant applies no warpers).
    """
    logits = logits.float()
    if not settings.sample:
        return torch.softmax(logits, dim=-1)
    logits = logits / settings.temperature
    if settings.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the top token always stays)
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= settings.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def speculative_accept(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator) -> tuple[int, int]:
    """Leviathan et al. rejection rule.

    p: target probabilities, shape [k+1, V] (row i scores the position of draft i; row k is the bonus).
    q: assistant probabilities the drafts were sampled from, shape [k, V].
    Returns (number of accepted drafts n, the target's token at position n).
    """
    for i, token in enumerate(drafts):
        ratio = p[i, token] / q[i, token]
        # strictly below: rand can be exactly 0, and a draft the target gives no mass (a copied token outside its
        # top-p set, routine for prompt lookup) must never be accepted; ratio >= 1 still always accepts
        if torch.rand((), generator=generator, device=p.device) < ratio:
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = residual.sum()
        # p == q up to rounding leaves no residual mass; then p itself is the right distribution
        dist = residual / total if total > 0 else p[i]
        return i, int(torch.multinomial(dist, 1, generator=generator))
    k = len(drafts)
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def greedy_accept(target_logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """Longest prefix of drafts equal to the target's argmax, plus the target's own next token."""
    choice = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == choice[n]:
        n += 1
    return n, choice[n]


TOP_K_MASS = 10  # llama.cpp's draft sampler keeps the 10 likeliest tokens (its p-min reads the renormalized prob)


def draft_features(q: torch.Tensor, token: int) -> tuple[float, float, float, float]:
    """What a policy sees of one draft distribution: the drafted token's probability, the entropy (nats), the top-1
    minus top-2 margin and the mass of the ``TOP_K_MASS`` likeliest tokens. Replay tables store the same four
    numbers (``disco.replay.tables.ChainBuilder``)."""
    top = torch.topk(q, k=min(TOP_K_MASS, q.shape[-1])).values
    values = top[:2].tolist()
    margin = values[0] - values[1] if len(values) > 1 else values[0]
    return float(q[token]), float(torch.special.entr(q).sum()), float(margin), float(top.sum())
