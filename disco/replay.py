"""Exact greedy replay: run any lookahead policy over a precomputed table instead of the models.

With greedy decoding the output is the target's own greedy continuation ``G`` of the prompt, and
what the assistant drafts from any prefix ``prompt + G[:p]`` is deterministic: its greedy chain
``chain_p``. A table of ``G`` and those chains (each token with its probability) is therefore enough
to replay every policy exactly: its iterations, drafted/accepted counts, stop reasons, target and
assistant passes. Time is then estimated from per-pass costs (``disco.costs.CostModel``: measured
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

Replay is the second backend of the iteration core (``disco.core``), the live engine the first: the
budget, draft-stop loop, accept and cut rules and cache bookkeeping are the same code, and the
policies are the same objects (``disco.policies``). Each chain token carries what a policy's
``DraftStep`` needs (probability, entropy and top-2 margin of the draft distribution; format 2).
Tables are cached on disk as JSON (one file per prompt and model pair), so a sweep is resumable
and re-runs are free.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from disco.costs import CostModel, _crop, calibrate  # noqa: F401 - calibrate re-exported for older callers
from disco.core import Drafted, IterationCore, Verdict
from disco.engine import Decoder, DecodeSettings, InputError, distribution, draft_features
from disco.policies import KMAXES, STATIC_KS, TAUS, Autoregressive, Policy, RunContext, parse_strategy  # noqa: F401
from disco.trace import IterationRecord, iterations_frame, summarize

TABLE_FORMAT = 2  # 2: each chain token has its entropy and top-2 margin (format 1 had probabilities only)
AUTOREGRESSIVE = "autoregressive"


class ReplayError(RuntimeError):
    """A table that cannot answer (incomplete and no models attached), or a policy replay cannot run."""


CLASSIC_KINDS = ("autoregressive", "static", "heuristic", "threshold", "oracle")


def rule_kinds() -> list[str]:
    """The stopping rules beyond the classic grid (adaptive, entropy, cumulative, costaware, disco, ...), in
    registration order; ``disco`` only once a trained classifier exists."""
    from disco.policies import policy_kinds

    return [cls.kind for cls in policy_kinds()
            if cls.kind not in CLASSIC_KINDS and cls.in_default_grid and cls.unavailable() is None]


def kind_grid(kind: str, kmaxes: Iterable[int] | None = None) -> list[str]:
    """A kind's grid from its parameters' metadata; its KMAX values replaced by ``kmaxes`` when given."""
    from disco.policies import canonical_spec, policy_class

    cls = policy_class(kind)
    combos = [{}]
    for p in cls.params:
        values = tuple(kmaxes) if (kmaxes is not None and p.token == "KMAX") else (p.grid or (p.default,))
        combos = [{**c, p.name: v} for v in values for c in combos]  # the first parameter varies fastest
    return [canonical_spec(kind, **c) for c in combos]


def default_grid(static_ks: Iterable[int] = STATIC_KS, taus: Iterable[float] = TAUS, kmaxes: Iterable[int] = KMAXES,
                 heuristic: Iterable[int] = (5,), oracle: bool = True, kinds: Iterable[str] | None = None) -> list[str]:
    """The benchmark's default grid, as strategy specs (the CLI's spelling): the classic kinds from the given
    values, then each stopping rule in ``kinds`` (default: every one available, ``rule_kinds``) from its own
    parameters' grid, with KMAX from ``kmaxes`` where the rule has one."""
    kmaxes = list(kmaxes)
    specs = [AUTOREGRESSIVE]
    specs += [f"static:{k}" for k in static_ks]
    specs += [f"heuristic:{k}" for k in heuristic]
    specs += [threshold_spec(t, k) for k in kmaxes for t in taus]
    if oracle:
        specs.append(f"oracle:{max(kmaxes) if kmaxes else 20}")
    for kind in (rule_kinds() if kinds is None else kinds):
        specs += kind_grid(kind, kmaxes or None)
    return list(dict.fromkeys(specs))


def threshold_spec(tau: float, kmax: int) -> str:
    return f"threshold:{format(float(tau), 'g')}:{int(kmax)}"


# ---------------------------------------------------------------------------------------------
# per-pass costs


# ---------------------------------------------------------------------------------------------
# the table


@dataclass
class Chain:
    """The assistant's greedy chain from one position: tokens, their probabilities, the entropies and top-2
    margins of their draft distributions, and whether it hit EOS."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    ended: bool = False
    entropies: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)

    def tail(self, d: int) -> "Chain":
        return Chain(self.tokens[d:], self.probs[d:], self.ended, self.entropies[d:], self.margins[d:])


class ChainBuilder:
    """One assistant KV cache that walks along ``prompt + G`` (+ a chain), reusing the longest common prefix."""

    def __init__(self, pair):
        from transformers import DynamicCache

        self.pair = pair
        self.model = pair.assistant
        self.cache = DynamicCache(config=self.model.config)
        self.seq: list[int] = []
        self.next: tuple[int, float, float, float] | None = None
        self.passes = 0
        self.tokens_fed = 0
        self.ms = 0.0

    @torch.inference_mode()
    def next_after(self, seq: list[int]) -> tuple[int, float, float, float]:
        """The assistant's greedy token after ``seq``: (token, probability, entropy, margin), as the engine
        computes them (``disco.engine.draft_features``)."""
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
        _crop(self.cache, common)
        feed = seq[common:]
        start = time.perf_counter()
        x = torch.tensor([feed], dtype=torch.long, device=self.pair.device)
        out = self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=1)
        probs = distribution(out.logits[0, -1:].float()[0], DecodeSettings())
        token = int(probs.argmax())
        self.ms += (time.perf_counter() - start) * 1000.0
        self.passes += 1
        self.tokens_fed += len(feed)
        self.seq = list(seq)
        self.next = (token, *draft_features(probs, token))
        return self.next


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

    # -- persistence -------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "format": TABLE_FORMAT, "meta": self.meta, "prompt_ids": self.prompt_ids, "reference": self.reference,
            "max_new_tokens": self.max_new_tokens, "eos_ids": sorted(self.eos),
            "chains": {str(p): [c.tokens, [round(x, 7) for x in c.probs], c.ended, [round(x, 6) for x in c.entropies],
                                [round(x, 7) for x in c.margins]] for p, c in sorted(self.chains.items())},
        }

    @classmethod
    def from_dict(cls, data: dict, path: Path | None = None) -> "ReplayTable":
        if data.get("format") != TABLE_FORMAT:
            raise ReplayError(f"unsupported replay table format {data.get('format')!r}")
        chains = {int(p): Chain(list(t), list(pr), bool(e), list(h), list(m)) for p, (t, pr, e, h, m) in data["chains"].items()}
        return cls(data["prompt_ids"], data["reference"], data["max_new_tokens"], data["eos_ids"], chains,
                   data.get("meta"), path)

    def save(self, path: Path | None = None) -> None:
        path = Path(path or self.path) if (path or self.path) else None
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        os.replace(tmp, path)  # atomic: an interrupted save never leaves a broken table
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
            self.builder = ChainBuilder(pair)
        return self

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

    def features(self, p: int, j: int) -> tuple[int, float, float, float]:
        """Token j of the chain from position p: (token, probability, entropy, margin)."""
        chain = self.extend(p, j)
        return chain.tokens[j], chain.probs[j], chain.entropies[j], chain.margins[j]

    def extend(self, p: int, j: int) -> Chain:
        """The chain from position p, computed (models attached) until it has token j."""
        chain = self._chain(p)
        while len(chain.tokens) <= j:
            if chain.ended:
                raise ReplayError(f"chain at position {p} ended with EOS after {len(chain.tokens)} tokens")
            if self.builder is None:
                raise ReplayError(f"the replay table has no chain token {j} at position {p}; attach the models to extend it")
            if p > len(self.reference):
                raise ReplayError(f"position {p} is past the reference ({len(self.reference)} tokens)")
            token, prob, entropy, margin = self.builder.next_after(self.prompt_ids + self.reference[:p] + chain.tokens)
            chain.tokens.append(token)
            chain.probs.append(prob)
            chain.entropies.append(entropy)
            chain.margins.append(margin)
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
    info = dict(pair.describe())
    # the assistant's precision changes its chains (an int8 and a bf16 assistant draft differently)
    blob = json.dumps([info.get("models"), info.get("target"), info.get("assistant"), info.get("dtype"),
                       info.get("device"), info.get("assistant_precision", "model"), list(prompt_ids)],
                      separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:60] or "prompt"


def table_path(cache_dir: str | os.PathLike, name: str, key: str) -> Path:
    """Where the table of prompt ``name`` with ``table_key`` ``key`` is cached."""
    return Path(cache_dir) / f"{_safe(name)}-{key}.json"


def cached_table_paths(cache_dir: str | os.PathLike, name: str) -> list[Path]:
    """Every cached table of prompt ``name`` in ``cache_dir``, whatever models it was built with."""
    pattern = re.compile(re.escape(_safe(name)) + r"-[0-9a-f]{16}\.json")
    return [p for p in sorted(Path(cache_dir).glob(f"{_safe(name)}-*.json")) if pattern.fullmatch(p.name)]


def build_table(pair, prompt_ids: list[int], max_new_tokens: int, cache_dir: str | os.PathLike | None = None,
                name: str = "prompt", progress: Callable[[int, int], None] | None = None) -> ReplayTable:
    """Load the prompt's table from ``cache_dir`` or compute its reference (the target's greedy output).

    Chains are filled lazily by replays (the table is returned with the models attached).
    ``progress(tokens_done, max_new_tokens)`` is called while the reference is decoded.
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
        decoder = Decoder(pair, list(prompt_ids), Autoregressive(), DecodeSettings(max_new_tokens=max_new_tokens))
        while not decoder.done:
            decoder.step()
            if progress is not None:
                progress(len(decoder.output_ids), max_new_tokens)
        reference = decoder.output_ids
        meta = dict(pair.describe())
        meta.update(reference_seconds=time.perf_counter() - start, prompt_tokens=len(prompt_ids))
        old = table
        table = ReplayTable(prompt_ids, reference, max_new_tokens, pair.eos_ids, meta=meta, path=path)
        if old is not None and old.reference == reference[: len(old.reference)]:
            table.chains = {p: c for p, c in old.chains.items() if p < len(old.reference)}
        if path is not None:
            table.save()
    return table.attach(pair)


# ---------------------------------------------------------------------------------------------
# replay


@dataclass
class ReplayResult:
    strategy: str
    records: list[IterationRecord]
    output_ids: list[int]
    assistant_tokens: int = 0  # tokens fed to the assistant (prefill included)

    def frame(self):
        return iterations_frame(self.records)

    def summary(self) -> dict:
        row = summarize(self.strategy, self.frame())
        row["overhead_pct"] = math.nan  # replay has no engine overhead to measure
        return row


class ReplayRun:
    """One policy replayed over a table: the replay backend of the iteration core, one iteration per ``step()``.

    Drafts come from the table's chains, verification from its reference (greedy: accept the longest prefix
    of the drafts equal to it, then its own token), and pass costs from ``costs`` (none: times are nan)."""

    def __init__(self, table: ReplayTable, policy: Policy, max_new_tokens: int | None = None,
                 costs: CostModel | None = None):
        m = table.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if m < 1:
            raise InputError(f"max_new_tokens must be positive, got {m}")
        self.table = table
        self.policy = policy
        self.max_new_tokens = m
        self.reference = table.reference_for(m)
        self.costs = costs
        self.assistant_precision = str(table.meta.get("assistant_precision", "model"))
        self._now = 0.0  # modelled ms: advanced by each pass's cost
        self.core = IterationCore(policy, table.prompt_ids, m, table.eos, self)
        policy.bind(RunContext(costs=costs, reference=list(self.reference)))

    @property
    def records(self) -> list[IterationRecord]:
        return self.core.records

    @property
    def done(self) -> bool:
        return self.core.done

    @property
    def position(self) -> int:
        return self.core.out_len

    @property
    def assistant_tokens(self) -> int:
        return self.core.assistant_tokens

    @property
    def elapsed_ms(self) -> float:
        return self.core.elapsed_ms

    # -- the core's backend ---------------------------------------------------------------------

    def clock(self) -> float:
        return self._now

    def _charge(self, fn, n: int) -> float:
        ms = fn(n) if self.costs is not None else math.nan
        self._now += ms
        return ms

    def draft(self, core: IterationCore, index: int, fed: int) -> Drafted:
        token, prob, entropy, margin = self.table.features(core.out_len, index)
        return Drafted(token, prob, entropy, margin, self._charge(self.costs.assistant_ms if self.costs else None, fed))

    def verify(self, core: IterationCore, fed: int, steps) -> Verdict:
        ms = self._charge(self.costs.target_ms if self.costs else None, fed)
        ref, out_len = self.reference, core.out_len
        accepted = 0
        while accepted < len(steps) and out_len + accepted < len(ref) and steps[accepted].token == ref[out_len + accepted]:
            accepted += 1
        if out_len + accepted < len(ref):
            return Verdict(accepted, ref[out_len + accepted], ms)
        if accepted and ref[-1] in self.table.eos:  # an accepted EOS draft ends the output; no target token follows
            return Verdict(accepted, ref[-1], ms)
        raise ReplayError("the reference ended without EOS before max_new_tokens")

    def probe(self, core: IterationCore, drafts: list[int]) -> int:
        return len(drafts)  # the reference is exact: the oracle's drop() already kept only what is accepted

    def rollback(self, t_len: int, a_len: int) -> None:
        pass  # replay has no caches; the core keeps the lengths that decide what each pass is fed

    def step(self) -> IterationRecord:
        return self.core.step()

    def result(self) -> ReplayResult:
        return ReplayResult(self.policy.spec, self.records, self.reference[: self.core.out_len], self.assistant_tokens)


def replay_many(table: ReplayTable, specs: Iterable[str | Policy], max_new_tokens: int | None = None,
                costs: CostModel | None = None, progress: Callable[[float], None] | None = None) -> dict[str, ReplayResult]:
    """Replay several policies on one table, always advancing the one furthest behind.

    Ordering by position keeps the lazy chain computation moving forward along the text, so the
    assistant's cache is reused instead of rebuilt. ``progress(fraction)`` is called (at most about
    four times a second) with the position of the run furthest behind, as a fraction of the output.
    """
    runs = []
    for item in specs:
        policy = parse_strategy(item) if isinstance(item, str) else item
        runs.append(ReplayRun(table, policy, max_new_tokens, costs))
    heap = [(0, i) for i in range(len(runs))]
    heapq.heapify(heap)
    last = time.monotonic()
    total = max(1, len(runs[0].reference)) if runs else 1
    while heap:
        position, i = heapq.heappop(heap)
        if progress is not None and time.monotonic() - last > 0.25:
            progress(min(1.0, position / total))
            last = time.monotonic()
        run = runs[i]
        run.step()
        if not run.done:
            heapq.heappush(heap, (run.position, i))
    return {run.policy.spec: run.result() for run in runs}


def replay(table: ReplayTable, spec: str | Policy, max_new_tokens: int | None = None,
           costs: CostModel | None = None) -> ReplayResult:
    """Replay one policy on one table."""
    return next(iter(replay_many(table, [spec], max_new_tokens, costs).values()))
