"""Prompt-lookup drafting: the draft is copied from the context itself, no assistant model runs.

``lookup:K[:NGRAM]`` follows transformers' ``PromptLookupCandidateGenerator`` (``prompt_lookup_num_tokens`` = K,
``max_matching_ngram_size`` = NGRAM, default 2; read in transformers 5.x ``generation/candidate_generator.py``):
for n = NGRAM down to 1, find the *earliest* earlier occurrence of the context's last n tokens (prompt and output
so far) that has at least one token after it, and draft the up to K tokens that followed it there, cut before the
first end-of-sequence token; no occurrence of any size: nothing is drafted (a plain target step). The idea is
Saxena's prompt lookup decoding (2023); vLLM's ``ngram`` and llama.cpp's n-gram drafters are variants.

A copied draft has no probabilities: as a draft distribution it is a point mass on the copied token, so its
confidence is 1, the Leviathan rule accepts it with the target's own probability of that token, and the
residual is the target's distribution without it (``disco.decode.sampling``): sampling keeps the target's
distribution exactly. Its cost is the lookup itself, a scan of the context in Python (measured worst case, no match
at all: 0.04 ms over 1,000 tokens, 0.4 ms over 4,000, against 50+ ms a target pass): measured live, charged zero in
replay.

``copy:KMAX[:MIN]`` is the dynamic form: the same match, but the draft is as long as the match's *evidence*, the
number of tokens that agree backwards from the matched place (how long the context has been copying it), at most
KMAX, and nothing while fewer than MIN tokens agree. A fresh two-token coincidence drafts two tokens or none; a
passage copied for forty tokens drafts KMAX. Measured on the embedded pair's greedy outputs (llama.cpp engine, the
suite's 16 train prompts, 48 tokens each; ``scripts/lookup_evidence.py TABLE_DIR train``): the first copied token is
the target's own next token 20 % of the time after one agreeing token (196 matches), 47 % after two, 76 % after
three, 70-85 % after four to seven and 92 % after eight or more (90 matches); the test prompts give the same picture
(21 / 47 / 63 / 73-88 / 93 %). So the evidence predicts acceptance; MIN is where that probability pays the next
verified token on the run's machine (chosen on the train split like every other parameter; docs/policies.md, prompt lookup).
"""

from __future__ import annotations

from disco.policies.base import KMAX, Param, Policy

LOOKUP_KS = (2, 4, 8, 10, 16)
NGRAM_DEFAULT = 2  # transformers' max_matching_ngram_size default
EVIDENCE_CAP = 64  # how far back a match's agreement is counted (bounds the work per iteration)


def find_match(ids: list[int], ngram: int) -> tuple[int, int] | None:
    """transformers' prompt-lookup match: (start of the copied continuation, n-gram size) of the earliest earlier
    occurrence of the last n tokens, trying n = ``ngram`` down to 1; None when nothing matches."""
    length = len(ids)
    for n in range(min(ngram, length - 1), 0, -1):
        pattern = ids[length - n:]
        first = pattern[0]
        for i in range(0, length - n):  # i + n < length: the occurrence has a token after it
            if ids[i] == first and ids[i:i + n] == pattern:
                return i + n, n
    return None


def evidence(ids: list[int], start: int, cap: int = EVIDENCE_CAP) -> int:
    """How many tokens agree backwards between the context's end and the end of the match (``start``)."""
    n, length = 0, len(ids)
    while n < cap and start - 1 - n >= 0 and ids[start - 1 - n] == ids[length - 1 - n]:
        n += 1
    return n


def copied(ids: list[int], start: int, k: int, eos) -> list[int]:
    """Up to ``k`` tokens from ``start``, cut before the first end-of-sequence token (transformers does the same:
    an EOS draft the target accepts would let it accept what follows it)."""
    out = ids[start:min(start + k, len(ids))]
    for i, token in enumerate(out):
        if token in eos:
            return out[:i]
    return out


class Lookup(Policy):
    """Prompt lookup with a fixed draft length (transformers' ``prompt_lookup_num_tokens``)."""

    kind = "lookup"
    summary = ("copy up to K tokens from the earliest earlier place where the last NGRAM tokens occur (no assistant; "
               "pays where the answer copies the prompt: code edits, extraction)")
    params = (Param("k", "K", int, 1, KMAX().hi, None, "prompt_lookup_num_tokens: tokens copied per iteration", "k",
                    LOOKUP_KS),
              Param("ngram", "NGRAM", int, 1, 8, NGRAM_DEFAULT, "max_matching_ngram_size: longest n-gram matched", "",
                    (NGRAM_DEFAULT,)))
    color = "#44aa99"  # teal (Tol)
    canonical = "lookup:10"
    cite = "Saxena 2023 (prompt lookup decoding); transformers prompt_lookup_num_tokens / max_matching_ngram_size"
    uses_assistant = False
    proposes = True

    def budget(self) -> int:
        return self.k

    def propose(self, ids: list[int], budget: int, eos) -> list[int]:
        match = find_match(ids, self.ngram)
        return copied(ids, match[0], budget, eos) if match is not None and budget > 0 else []

    def hf_kwargs(self) -> dict:
        return {"prompt_lookup_num_tokens": self.k, "max_matching_ngram_size": self.ngram}


class Copy(Lookup):
    """Prompt lookup whose draft is as long as the match's evidence (tokens agreeing backwards), at most KMAX, and
    nothing while that evidence is shorter than MIN."""

    kind = "copy"
    summary = ("prompt lookup that copies as many tokens as agree before the matched place (at most KMAX), none while "
               "fewer than MIN agree (pays where the answer copies the prompt)")
    params = (KMAX(16, (8, 16, 32)),
              Param("min_evidence", "MIN", int, 1, 16, 2, "tokens that must agree before the copied place to draft",
                    "", (1, 2, 3, 4, 5)))
    color = "#332288"  # indigo (Tol)
    canonical = "copy:16"
    cite = "this project (docs/policies.md, prompt lookup): the match of transformers' prompt lookup, length = its evidence"

    def reset(self) -> None:
        super().reset()
        self.ngram = NGRAM_DEFAULT  # transformers' matching (its default n-gram size); MIN gates on the evidence

    def propose(self, ids: list[int], budget: int, eos) -> list[int]:
        match = find_match(ids, self.ngram)
        if match is None or budget <= 0:
            return []
        start = match[0]
        agree = evidence(ids, start, max(EVIDENCE_CAP, self.k))
        return copied(ids, start, min(budget, agree), eos) if agree >= self.min_evidence else []

    def hf_kwargs(self) -> None:
        return None


def latest_match(ids: list[int], n: int, m: int) -> list[int]:
    """llama.cpp's ``common_ngram_simple_draft`` (vendored ``common/ngram-map.cpp``) on ``ids`` = its token history
    plus the token just sampled: the *latest* earlier occurrence of the last ``n`` tokens (position 0 never counts,
    nor the current place), the up to ``m`` tokens that followed it there, and nothing unless at least ``n`` follow
    or the history holds more than ``n + m + 1`` tokens (its own guards, kept as written)."""
    history = len(ids) - 1  # llama.cpp's cur_len: the sampled token is the pattern's last, not in its history
    if history <= n + m + 1:
        return []
    pattern = ids[-n:]
    for j in range(history - n - 1, 0, -1):
        if ids[j:j + n] == pattern:
            count = min(m, history - (j + n))
            return ids[j + n:j + n + count] if count >= n else []
    return []


class NGram(Lookup):
    """llama.cpp's ``ngram-simple`` drafter: its match (the latest occurrence of exactly N tokens) and its length."""

    kind = "ngram"
    summary = ("llama.cpp's ngram-simple: copy up to M tokens from the latest earlier place where the last N tokens "
               "occur, nothing unless at least N follow it (no assistant)")
    params = (Param("ngram", "N", int, 1, 64, 12, "--spec-ngram-simple-size-n: the n-gram matched", "", (2, 3, 4, 12)),
              Param("k", "M", int, 1, KMAX().hi, 48, "--spec-ngram-simple-size-m: the most tokens copied", "k",
                    (16, 48)))
    color = "#999933"  # olive (Tol)
    canonical = "ngram:12:48"
    cite = "llama.cpp common/ngram-map.cpp common_ngram_simple_draft (--spec-type ngram-simple), llama-cpp-python 0.3.36"

    def propose(self, ids: list[int], budget: int, eos) -> list[int]:
        # llama.cpp neither cuts its n-gram draft at an end-of-sequence token nor stops the search early: neither
        # changes the output (the core cuts what is accepted at EOS), only what is verified
        return latest_match(ids, self.ngram, self.k)[:budget] if budget > 0 else []

    def hf_kwargs(self) -> None:
        return None

    def llama_args(self) -> list[str]:
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.ngram),
                "--spec-ngram-simple-size-m", str(self.k)]
