"""Replay tables: what exact greedy replay needs of the models, computed once per prompt and pair and cached.

With greedy decoding the output is the target's own greedy continuation ``G`` of the prompt, and
what the assistant drafts from any prefix ``prompt + G[:p]`` is deterministic: its greedy chain
``chain_p``. A table of ``G`` and those chains (each token with its probability) is therefore enough
to replay every policy exactly: its iterations, drafted/accepted counts, stop reasons, target and
assistant passes. Time is then estimated from per-pass costs (``disco.costs.model.CostModel``: measured
on this machine, flat, or read from a CSV): one assistant pass and one target pass as functions of the tokens they are fed.

Computing the table is the only expensive part, so it is done lazily and shares work:
  * chains are computed only as far as some replayed policy asks (``ReplayTable.draft``);
  * when ``chain_p`` starts with ``G[p]``, ``chain_{p+1}`` is ``chain_p[1:]`` (same prefix, same
    deterministic continuation), so it is derived, then extended one token at a time;
  * ``replay_many`` advances all policies together in order of position, so the single assistant
    KV cache (``ChainBuilder``) only moves forward, by a few tokens at a time.
We do not batch chains across positions: on a CPU without native bf16 a pass over n tokens costs
about n single-token passes (measured), so batching saves nothing there, while sequential feeds
keep the numbers closest to what the engine computes.

Replay (``disco.replay.run``) is the second backend of the iteration core (``disco.decode.core``), the live
engine the first: the
budget, draft-stop loop, accept and cut rules and cache bookkeeping are the same code, and the
policies are the same objects (``disco.policies``). Each chain token carries what a policy's
``DraftStep`` needs (probability, entropy and top-2 margin of the draft distribution; format 2).
Tables are cached on disk as JSON (one file per prompt and model pair, in ``disco.cache.tables_dir()``), so a
sweep is resumable and re-runs are free.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from disco import cache
from disco.decode.live import greedy_continuation
from disco.decode.sampling import distribution, draft_features
from disco.models.pair import prefill_boundary
from disco.decode.settings import DecodeSettings
from disco.errors import InputError, UserError
from disco.models.pair import pair_key

TABLE_FORMAT = 3  # 3: each chain token has its entropy, top-2 margin and top-10 mass (2 lacked the mass, 1 had probs only)


class ReplayError(UserError, RuntimeError):
    """A table that cannot answer (incomplete and no models attached), or a policy replay cannot run."""


class ChainEnded(ReplayError):
    """The assistant's chain reached EOS before the token asked for: there is no such draft token."""


class ChainMissing(ReplayError):
    """The table does not hold the chain token asked for and has no models attached to compute it."""


@dataclass
class Chain:
    """The assistant's greedy chain from one position: tokens, their probabilities, the entropies, top-2 margins and
    top-10 masses of their draft distributions, and whether it hit EOS."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    ended: bool = False
    entropies: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    top10s: list[float] = field(default_factory=list)

    def tail(self, d: int) -> "Chain":
        return Chain(self.tokens[d:], self.probs[d:], self.ended, self.entropies[d:], self.margins[d:], self.top10s[d:])


class ChainBuilder:
    """One assistant session (KV cache) that walks along ``prompt + G`` (+ a chain), reusing the longest common
    prefix."""

    def __init__(self, pair, prefill_upto: int | None = None):
        self.pair = pair
        self.prefill_upto = prefill_upto  # a fast prefill stops where the lanes' does (``prefill_boundary``)
        self.session = None  # made on first use; ``release`` hands it back between uses
        self.seq: list[int] = []
        self.next: tuple[int, float, float, float, float] | None = None
        self.passes = 0
        self.tokens_fed = 0
        self.ms = 0.0

    def next_after(self, seq: list[int]) -> tuple[int, float, float, float, float]:
        """The assistant's greedy token after ``seq``: (token, probability, entropy, margin, top-10 mass), as the engine
        computes them (``disco.decode.sampling.draft_features``)."""
        n = len(seq)
        if n == len(self.seq) and self.next is not None and seq == self.seq:
            return self.next
        if n == len(self.seq) + 1 and seq[:-1] == self.seq:
            common = n - 1
        else:
            common = 0
            for a, b in zip(self.seq, seq):
                if a != b:
                    break
                common += 1
        common = min(common, n - 1)  # feed at least one token to get its logits
        if self.session is None:
            self.session, self.seq, common = self.pair.session("assistant"), [], 0
            if self.prefill_upto is not None:
                prefill_boundary(self.session, self.prefill_upto)
        self.session.crop(common)
        feed = seq[common:]
        logits, ms = self.session.forward(feed, 1)
        probs = distribution(logits[0], DecodeSettings())
        token = int(probs.argmax())
        self.ms += ms
        self.passes += 1
        self.tokens_fed += len(feed)
        self.seq = list(seq)
        self.next = (token, *draft_features(probs, token))
        return self.next

    def release(self) -> None:
        """Hand the assistant's session back (a llama.cpp context returns to its pool; a benchmark holds a table per
        prompt, and each kept session would hold its context); the next chain starts a new one."""
        if self.session is not None:
            self.session.close()
        self.session, self.seq, self.next = None, [], None


class ReplayTable:
    """The target's greedy continuation of one prompt and the assistant's greedy chains along it.

    ``draft(p, j)`` is token j of the chain from output position p (computed on demand when a pair
    is attached). ``reference`` is the target's greedy output (cut at EOS / ``max_new_tokens``).
    """

    def __init__(self, prompt_ids: list[int], reference: list[int], max_new_tokens: int, eos_ids: Iterable[int],
                 chains: dict[int, Chain] | None = None, meta: dict | None = None, path: Path | None = None):
        self.prompt_ids = list(prompt_ids)
        self.reference = list(reference)
        self.max_new_tokens = int(max_new_tokens)
        self.eos = set(int(e) for e in eos_ids)
        self.chains: dict[int, Chain] = chains or {}
        self.meta = dict(meta or {})
        self.path = path
        self.builder: ChainBuilder | None = None
        self.dirty = False
        self.on_extend: Callable[[], None] | None = None
        self._last_save = time.monotonic()
        self.stats: dict[str, float] = {}  # this process's build work (seconds, passes): reported, never saved

    # -- persistence -------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "format": TABLE_FORMAT, "meta": self.meta, "prompt_ids": self.prompt_ids, "reference": self.reference,
            "max_new_tokens": self.max_new_tokens, "eos_ids": sorted(self.eos),
            "chains": {str(p): [c.tokens, [round(x, 7) for x in c.probs], c.ended, [round(x, 6) for x in c.entropies],
                                [round(x, 7) for x in c.margins], [round(x, 7) for x in c.top10s]]
                       for p, c in sorted(self.chains.items())},
        }

    @classmethod
    def from_dict(cls, data: dict, path: Path | None = None) -> "ReplayTable":
        if data.get("format") != TABLE_FORMAT:
            raise ReplayError(f"unsupported replay table format {data.get('format')!r}")
        chains = {int(p): Chain(list(t), list(pr), bool(e), list(h), list(m), list(k))
                  for p, (t, pr, e, h, m, k) in data["chains"].items()}
        return cls(data["prompt_ids"], data["reference"], data["max_new_tokens"], data["eos_ids"], chains,
                   data.get("meta"), path)

    def save(self, path: Path | None = None) -> None:
        path = Path(path or self.path) if (path or self.path) else None
        if path is None:
            return
        cache.write_json(path, self.to_dict(), indent=None, quiet=False)  # atomic: never a broken table
        self.path = path
        self.dirty = False
        self._last_save = time.monotonic()

    # -- lookups ---------------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """The reference ended (EOS) before max_new_tokens, so it is the whole greedy output for any length."""
        return bool(self.reference) and self.reference[-1] in self.eos

    def covers(self, max_new_tokens: int) -> bool:
        return self.complete or len(self.reference) >= max_new_tokens

    def attach(self, pair) -> "ReplayTable":
        """Attach the models so missing chain tokens can be computed on demand."""
        if self.builder is None or self.builder.pair is not pair:
            self.builder = ChainBuilder(pair, len(self.prompt_ids) - 1)
        return self

    def release(self) -> None:
        """Hand back the assistant session the chain builder holds, between uses (the models stay attached)."""
        if self.builder is not None:
            self.builder.release()

    def _chain(self, p: int) -> Chain:
        chain = self.chains.get(p)
        if chain is not None:
            return chain
        # derive from the nearest earlier chain that agrees with G up to p (a suffix of it)
        best = None
        for q in range(p - 1, max(-1, p - 257), -1):
            c = self.chains.get(q)
            if c is None:
                continue
            d = p - q
            if len(c.tokens) > d and c.tokens[:d] == self.reference[q:p]:
                if best is None or len(c.tokens) - d > len(best.tokens):
                    best = c.tail(d)
            if c.tokens[: min(d, len(c.tokens))] != self.reference[q:q + min(d, len(c.tokens))]:
                break  # an earlier chain that agreed this far would have made this one agree too
        chain = best or Chain()
        self.chains[p] = chain
        return chain

    def draft(self, p: int, j: int) -> tuple[int, float]:
        """Token j (0-based) of the assistant's greedy chain from output position p, with its probability."""
        chain = self.extend(p, j)
        return chain.tokens[j], chain.probs[j]

    def features(self, p: int, j: int) -> tuple[int, float, float, float, float]:
        """Token j of the chain from position p: (token, probability, entropy, margin, top-10 mass)."""
        chain = self.extend(p, j)
        return chain.tokens[j], chain.probs[j], chain.entropies[j], chain.margins[j], chain.top10s[j]

    def extend(self, p: int, j: int) -> Chain:
        """The chain from position p, computed (models attached) until it has token j."""
        chain = self._chain(p)
        while len(chain.tokens) <= j:
            if chain.ended:
                raise ChainEnded(f"chain at position {p} ended with EOS after {len(chain.tokens)} tokens")
            if self.builder is None:
                raise ChainMissing(f"the replay table has no chain token {j} at position {p}; attach the models to extend it")
            if p > len(self.reference):
                raise ReplayError(f"position {p} is past the reference ({len(self.reference)} tokens)")
            token, prob, entropy, margin, top10 = self.builder.next_after(self.prompt_ids + self.reference[:p] + chain.tokens)
            chain.tokens.append(token)
            chain.probs.append(prob)
            chain.entropies.append(entropy)
            chain.margins.append(margin)
            chain.top10s.append(top10)
            chain.ended = token in self.eos
            self.dirty = True
            if self.on_extend is not None:
                self.on_extend()
            if self.path is not None and time.monotonic() - self._last_save > 60:
                self.save()  # resumable: a long build never loses more than a minute
        return chain

    def first_token_agreement(self, max_new_tokens: int | None = None) -> tuple[int, int]:
        """(positions where the assistant's first draft equals the target's token, positions checked).

        This is the per-token acceptance rate alpha of Leviathan et al.'s analysis.
        """
        m = min((max_new_tokens or self.max_new_tokens) - 1, len(self.reference))  # positions a draft can start at
        hits = total = 0
        for p in range(0, m):
            token, _ = self.draft(p, 0)
            hits += token == self.reference[p]
            total += 1
        return hits, total

    def reference_for(self, max_new_tokens: int) -> list[int]:
        if not self.covers(max_new_tokens):
            raise ReplayError(f"the table's reference has {len(self.reference)} tokens, fewer than max_new_tokens={max_new_tokens}")
        return self.reference[:max_new_tokens]


def table_key(pair, prompt_ids: list[int]) -> str:
    return pair_key(pair, list(prompt_ids))


def _safe(name: str) -> str:
    return cache.safe_name(name) if name else "prompt"


def table_path(cache_dir: str | Path, name: str, key: str) -> Path:
    """Where the table of prompt ``name`` with ``table_key`` ``key`` is cached."""
    return Path(cache_dir) / f"{_safe(name)}-{key}.json"


def cached_table_paths(cache_dir: str | Path, name: str) -> list[Path]:
    """Every cached table of prompt ``name`` in ``cache_dir``, whatever models it was built with."""
    pattern = re.compile(re.escape(_safe(name)) + r"-[0-9a-f]{16}\.json")
    return [p for p in sorted(Path(cache_dir).glob(f"{_safe(name)}-*.json")) if pattern.fullmatch(p.name)]


MACHINE_KEYS = ("threads",)  # how this process ran the pair, not what it computes: kept out of a table's meta


def pair_meta(pair) -> dict:
    """What a table records of the pair that computed it (``describe()`` less how this process ran it): the same on
    every machine that computes the same numbers (a Ray worker's identity too)."""
    return {k: v for k, v in pair.describe().items() if k not in MACHINE_KEYS}


def build_table(pair, prompt_ids: list[int], max_new_tokens: int, cache_dir: str | Path | None = None,
                name: str = "prompt", progress: Callable[[int, int], None] | None = None,
                about: dict | None = None) -> ReplayTable:
    """Load the prompt's table from ``cache_dir`` (the app and the commands pass the one cache,
    ``disco.cache.tables_dir()``; None: no file) or compute its reference (the target's greedy output).

    Chains are filled lazily by replays (the table is returned with the models attached).
    ``progress(tokens_done, max_new_tokens)`` is called while the reference is decoded. ``about`` (what the prompt
    is: its suite record's fingerprint, how it was fitted to the context) is kept in the table's meta under
    ``prompt``. A table holds only what the models compute, never how long it took or how many threads ran it, so
    the same table built anywhere is the same bytes (``stats`` has this process's build times, not saved).
    """
    if not prompt_ids:
        raise InputError("the prompt encodes to zero tokens")
    path = table_path(cache_dir, name, table_key(pair, prompt_ids)) if cache_dir is not None else None
    table = None
    if path is not None and path.is_file():
        try:
            table = ReplayTable.from_dict(json.loads(path.read_text()), path)
        except (ValueError, KeyError, TypeError, ReplayError):
            table = None  # a damaged or old cache file is rebuilt
        if table is not None and table.prompt_ids != list(prompt_ids):
            table = None
    if table is None or not table.covers(max_new_tokens):
        start = time.perf_counter()
        reference = greedy_continuation(pair, list(prompt_ids), max_new_tokens, progress=progress)
        meta = pair_meta(pair)
        meta.update(prompt_tokens=len(prompt_ids), **({"prompt": about} if about else {}))
        old = table
        table = ReplayTable(prompt_ids, reference, max_new_tokens, pair.eos_ids, meta=meta, path=path)
        table.stats["reference_seconds"] = time.perf_counter() - start
        if old is not None and old.reference == reference[: len(old.reference)]:
            table.chains = {p: c for p, c in old.chains.items() if p < len(old.reference)}
        if path is not None:
            table.save()
    elif about and table.meta.get("prompt") != about:  # a table from before suites described their prompts
        table.meta["prompt"] = about
        table.dirty = True
    return table.attach(pair)
