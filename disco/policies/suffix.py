"""Suffix decoding's drafting rule over the request's own context (Oliaro et al. 2024, arXiv 2411.04975; vLLM's
``suffix`` method, PR #25784, which calls Snowflake's Arctic Inference).

Suffix decoding matches the longest suffix of the context (prompt and output so far) that occurred earlier, and
follows the most frequent continuation of all those earlier occurrences, token by token; each drafted token carries
an estimated probability from the occurrence counts (the share of the matched occurrences that continue with the
path drafted so far). Its length rule, as vLLM configures it (``suffix_decoding_max_spec_factor``,
``suffix_decoding_min_token_prob``, ``suffix_decoding_max_tree_depth``; defaults 1.0, 0.1, 24):

* at most FACTOR × the matched length tokens (a longer match earns a longer draft; no match, no draft),
* and never a token whose estimated probability is below MINPROB,
* with the match and the draft together within the tree depth (24), and at most KMAX tokens
  (``num_speculative_tokens``, which vLLM defaults to the tree depth).

Only the per-request tree exists in one race: the global tree over earlier requests' outputs
(``suffix_decoding_max_cached_requests``) has no counterpart here. Drafts are point masses as for prompt lookup
(``disco.policies.lookup``), so sampling stays exact; greedy drafting follows the single most frequent path (Arctic's
path mode, not its tree mode).
"""

from __future__ import annotations

from disco.policies.base import Param
from disco.policies.lookup import Lookup

TREE_DEPTH = 24  # vLLM's suffix_decoding_max_tree_depth default: the match and the draft together


def matches(ids: list[int], depth: int = TREE_DEPTH) -> tuple[int, list[int]]:
    """The longest suffix of ``ids`` (at most ``depth`` tokens) that occurred earlier with a token after it: its
    length and the positions right after each of its earlier occurrences (empty when even the last token is new)."""
    n = len(ids)
    if n < 2:
        return 0, []
    last, agree = ids[-1], {}
    for p in range(n - 1):  # p + 1 < n: the occurrence has a continuation
        if ids[p] == last:
            m = 1
            while m < depth and p - m >= 0 and ids[p - m] == ids[n - 1 - m]:
                m += 1
            agree[p + 1] = m
    if not agree:
        return 0, []
    longest = max(agree.values())
    return longest, [start for start, m in agree.items() if m == longest]


def follow(ids: list[int], starts: list[int], limit: int, min_prob: float, eos) -> list[int]:
    """The most frequent path from the occurrences' continuations, while its estimated probability (surviving
    occurrences ÷ all of them) stays at or above ``min_prob``; ties go to the token seen first; stops before EOS."""
    out, alive, total = [], list(starts), len(starts)
    while len(out) < limit and alive:
        counts: dict[int, int] = {}
        for s in alive:
            if s < len(ids):
                counts[ids[s]] = counts.get(ids[s], 0) + 1
        if not counts:
            break
        token = max(counts, key=lambda t: counts[t])  # dicts keep insertion order: the first seen wins a tie
        alive = [s + 1 for s in alive if s < len(ids) and ids[s] == token]
        if token in eos or len(alive) / total < min_prob:
            break
        out.append(token)
    return out


class Suffix(Lookup):
    """Suffix decoding's length rule on the request's own suffix tree."""

    kind = "suffix"
    summary = ("suffix decoding: the most frequent continuation of the longest earlier match, at most FACTOR × its "
               "length and KMAX tokens, each with an estimated probability ≥ MINPROB (no assistant)")
    params = (Param("factor", "FACTOR", float, 0.0, 16.0, 1.0, "vLLM's suffix_decoding_max_spec_factor", "",
                    (0.5, 1.0, 2.0)),
              Param("min_prob", "MINPROB", float, 0.0, 1.0, 0.1, "vLLM's suffix_decoding_min_token_prob", "",
                    (0.1, 0.5)),
              Param("k", "KMAX", int, 1, TREE_DEPTH, TREE_DEPTH, "num_speculative_tokens (vLLM: the tree depth)",
                    "", (TREE_DEPTH,)))
    color = "#88ccee"  # cyan (Tol)
    canonical = "suffix"
    cite = "Oliaro et al. 2024 (arXiv 2411.04975); vLLM suffix method (PR #25784, Arctic Inference)"

    def reset(self) -> None:
        super().reset()
        self.ngram = 0  # unused: the match is as long as it goes

    def propose(self, ids: list[int], budget: int, eos) -> list[int]:
        length, starts = matches(ids)
        limit = min(budget, self.k, int(self.factor * length), TREE_DEPTH - length)
        return follow(ids, starts, limit, self.min_prob, eos) if limit > 0 else []

    def hf_kwargs(self) -> None:
        return None
