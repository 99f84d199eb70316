"""Run several strategies on one prompt, round-robin, one iteration at a time.

Lanes share the CPU, so they never run in parallel: each ``step()`` runs alone and its measured
time is charged to its own lane only. After every step the runner yields a ``Snapshot`` that the
UI, the CLI and the exports read (they never look inside the models).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pandas as pd

from disco.costs.measure import cached_costs
from disco.decode.divergence import explain
from disco.decode.live import Decoder, greedy_continuation
from disco.decode.settings import DecodeSettings
from disco.decode.trace import iterations_frame, position_acceptance, summarize, tokens_frame
from disco.errors import InputError, Interrupted
from disco.models.pair import encode_prompt
from disco.models.precision import PrecisionError
from disco.policies import AUTOREGRESSIVE, Policy, parse_strategy


_REFERENCE_CACHE: "OrderedDict[tuple, list[int]]" = OrderedDict()


def greedy_reference(pair, prompt_ids: list[int], max_new_tokens: int, interrupt=None) -> list[int]:
    """The target's own greedy continuation (what the oracle knows in advance). Untimed; memoised.
    ``interrupt`` as for ``Decoder.step`` (raises ``Interrupted``; nothing is memoised then)."""
    key = (id(pair), tuple(prompt_ids), max_new_tokens)
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = greedy_continuation(pair, prompt_ids, max_new_tokens, interrupt)
        while len(_REFERENCE_CACHE) > 32:
            _REFERENCE_CACHE.popitem(last=False)
    return _REFERENCE_CACHE[key]


def build_policies(lanes: list) -> list[Policy]:
    """The lanes as policies: spec strings parsed (once, here at the edge), ``Policy`` objects kept; each lane must
    be distinct."""
    policies = [lane if isinstance(lane, Policy) else parse_strategy(lane) for lane in lanes]
    if not policies:
        raise InputError("no strategy given")
    specs = [p.spec for p in policies]
    duplicates = {s for s in specs if specs.count(s) > 1}
    if duplicates:
        raise InputError(f"strategy listed twice: {sorted(duplicates)[0]} (each lane needs a distinct spec)")
    return policies


def lane_pair(pair, policy: Policy):
    """The pair view a lane decodes with: its ``@precision`` assistant, or the pair's own default."""
    if not policy.uses_assistant or policy.assistant_precision in (None, pair.assistant_precision):
        return pair
    try:
        return pair.with_assistant(policy.assistant_precision)
    except PrecisionError as exc:
        raise InputError(f"strategy {policy.spec!r}: {exc}") from None


@dataclass
class Snapshot:
    """The state of every lane after one step of the race."""

    decoders: list[Decoder]
    settings: DecodeSettings
    meta: dict = field(default_factory=dict)
    last: str | None = None  # the strategy that just stepped

    @property
    def finished(self) -> bool:
        return all(d.done for d in self.decoders)

    @property
    def strategies(self) -> list[str]:
        return [d.strategy for d in self.decoders]

    def iterations(self) -> pd.DataFrame:
        return iterations_frame([r for d in self.decoders for r in d.records])

    def tokens(self) -> pd.DataFrame:
        return tokens_frame([t for d in self.decoders for t in d.tokens])

    def export_iterations(self) -> pd.DataFrame:
        """The per-iteration trace of every lane (long format) with the run's settings on every row, and each
        lane's divergence from the baseline (position and kind; empty where identical or not comparable)."""
        frame = _with_meta(self.iterations(), self.meta)
        divs = {s["strategy"]: s["divergence"] for s in self.summaries()}
        frame["divergence_position"] = frame["strategy"].map(lambda s: (divs.get(s) or {}).get("position"))
        frame["divergence_kind"] = frame["strategy"].map(lambda s: (divs.get(s) or {}).get("kind"))
        return frame

    def export_tokens(self) -> pd.DataFrame:
        return _with_meta(self.tokens(), self.meta)

    def export_positions(self) -> pd.DataFrame:
        """Each lane's acceptance by draft position (``position_acceptance``) with the run's settings."""
        return _with_meta(position_acceptance(self.iterations()), self.meta)

    def summaries(self, frame: pd.DataFrame | None = None) -> list[dict]:
        """Per-strategy summaries with speed-up and the lossless check against the autoregressive lane."""
        frame = self.iterations() if frame is None else frame
        base = next((d for d in self.decoders if d.strategy == AUTOREGRESSIVE), None)
        base_seconds = base.elapsed_ms / 1000.0 if base is not None and base.done else None
        rows = []
        for d in self.decoders:
            row = summarize(d.strategy, frame)
            row["text"] = d.text
            row["done"] = d.done
            row["finish_reason"] = d.finish_reason
            row["assistant_precision"] = d.pair.assistant_precision if d.policy.uses_assistant else "none"
            row["drafter"] = ("hybrid" if d.policy.uses_assistant and d.policy.proposes else "assistant"
                              if d.policy.uses_assistant else ("lookup" if d.policy.proposes else "none"))
            row["speedup"] = (base_seconds / row["seconds"]) if base_seconds and d.done and row["seconds"] > 0 else math.nan
            row["divergence"] = None
            if self.settings.sample or base is None or not (base.done and d.done):
                row["identical_to_autoregressive"] = None  # only meaningful for finished greedy runs
            else:
                row["identical_to_autoregressive"] = d.output_ids == base.output_ids
                if not row["identical_to_autoregressive"]:
                    row["divergence"] = explain(base.tokens, d.tokens, d.pair.dtype_name)
            row.update(self.meta)
            rows.append(row)
        return rows


def _with_meta(frame: pd.DataFrame, meta: dict) -> pd.DataFrame:
    frame = frame.copy()
    for key, value in meta.items():
        frame[key] = value
    return frame


def lane_costs(pair, policy: Policy, prompt_ids: list[int], costs_for: Callable | None = None):
    """The cost model a lane's policy reads (only the cost-aware one does): ``costs_for(assistant_precision)`` when
    the caller knows this machine's profile (the app), else this pair's measured costs, calibrated once if needed."""
    if not (policy.needs_costs or policy.reads_costs):
        return None
    model = costs_for(pair.assistant_precision) if costs_for is not None else None
    if model is None:
        model = cached_costs(pair, [prompt_ids], kmax=max(getattr(policy, "k", 1), 1), reps=1)
    return model


def race(pair, prompt: str, strategies: list, settings: DecodeSettings, chat: bool = False,
         meta: dict | None = None, should_stop: Callable[[], bool] | None = None,
         costs_for: Callable | None = None) -> Iterator[Snapshot]:
    """Advance every strategy (``Policy`` objects, or spec strings parsed here) one iteration at a time, round-robin;
    yield a snapshot after each step.

    Validation happens before the first yield, so bad input raises immediately. ``should_stop`` is polled
    before every forward pass: when it turns true the iteration in progress is abandoned and the race ends
    (the last snapshot yielded then holds every completed iteration; an oracle's reference interrupted while
    it is computed raises ``Interrupted`` here).
    """
    settings.validate()
    policies = build_policies(list(strategies))
    prompt_ids = encode_prompt(pair, prompt, chat, settings.max_new_tokens)
    # each lane drafts with the assistant its spec names (``@int8``), else with the pair's own
    lanes = [lane_pair(pair, policy) for policy in policies]
    decoders = [Decoder(p, prompt_ids, policy, settings, costs=lane_costs(p, policy, prompt_ids, costs_for))
                for p, policy in zip(lanes, policies)]  # validates policy x settings
    for p in lanes:
        p.warmup()
    for policy in policies:
        if policy.probes_verification:  # untimed: the oracle knows the target's answer in advance
            policy.reference = greedy_reference(pair, prompt_ids, settings.max_new_tokens, should_stop)
    info = dict(pair.describe())
    info.pop("assistant_precision", None)  # per lane: every trace row has its own assistant_precision
    info.update(prompt_tokens=len(prompt_ids), chat=chat, max_new_tokens=settings.max_new_tokens,
                sample=settings.sample, temperature=settings.temperature if settings.sample else None,
                top_p=settings.top_p if settings.sample else None, seed=settings.seed if settings.sample else None)
    info.update(meta or {})
    return _round_robin(decoders, settings, info, should_stop)


def _round_robin(decoders: list[Decoder], settings: DecodeSettings, info: dict,
                 should_stop: Callable[[], bool] | None = None) -> Iterator[Snapshot]:
    snapshot = Snapshot(decoders, settings, info)
    while not snapshot.finished:
        for d in decoders:
            if not d.done:
                try:
                    d.step(should_stop)
                except Interrupted:
                    return
                snapshot.last = d.strategy
                yield snapshot


def run_all(pair, prompt: str, strategies: list, settings: DecodeSettings, chat: bool = False) -> Snapshot:
    """Run the race to the end and return the final snapshot."""
    last = None
    for last in race(pair, prompt, strategies, settings, chat):
        pass
    return last
