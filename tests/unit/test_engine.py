"""The engine's invariants on the tiny pair: lossless greedy decoding for every strategy, cache
rollback, trace bookkeeping, EOS / length handling and reproducible sampling."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.errors import InputError, Interrupted
from disco.policies import parse_strategy
from disco.decode.race import greedy_reference, race, run_all
from disco.models import encode_prompt

STRATEGIES = [
    "autoregressive", "static:1", "static:3", "static:8", "heuristic:1", "heuristic:4",
    "threshold:0.4:20", "threshold:0.0:6", "threshold:0.9:3", "threshold:1.0:4", "threshold:0.2:1",
    "oracle", "oracle:3",
]
PROMPTS = [
    "def fibonacci(n):", "The quick brown fox", "Explain KV caches.", "x", "import numpy as np\n",
    "Once upon a time, in a land far away,", "SELECT * FROM users WHERE", "{'a': 1, 'b': [2, 3]}",
]


def _greedy(max_new_tokens: int) -> DecodeSettings:
    return DecodeSettings(max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("chat", [False, True])
def test_every_strategy_is_lossless_in_greedy_mode(tiny_pair, prompt, chat):
    final = run_all(tiny_pair, prompt, STRATEGIES, _greedy(40), chat=chat)
    base = final.decoders[0].output_ids
    assert len(base) > 0
    for d in final.decoders[1:]:
        assert d.output_ids == base, f"{d.strategy} diverged from autoregressive on {prompt!r}"
    summaries = final.summaries()
    assert all(s["identical_to_autoregressive"] is True for s in summaries)


def test_tiny_pair_exercises_every_outcome(tiny_pair):
    """Full accepts, partial accepts and outright rejections all occur, or the lossless tests prove little."""
    outcomes = set()
    for prompt in PROMPTS:
        frame = run_all(tiny_pair, prompt, ["static:4"], _greedy(40)).iterations()
        for drafted, accepted in zip(frame["lookahead"], frame["accepted"]):
            if drafted:
                outcomes.add("full" if accepted == drafted else ("none" if accepted == 0 else "partial"))
    assert outcomes == {"full", "partial", "none"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=30).filter(str.strip),
    strategy=st.sampled_from(STRATEGIES[1:]),
    max_new=st.integers(min_value=1, max_value=30),
)
def test_lossless_property(tiny_pair, prompt, strategy, max_new):
    final = run_all(tiny_pair, prompt, ["autoregressive", strategy], _greedy(max_new))
    ar, spec = final.decoders
    assert spec.output_ids == ar.output_ids
    assert len(spec.output_ids) <= max_new
    _check_invariants(spec, max_new)


def _check_invariants(decoder: Decoder, max_new: int) -> None:
    recs = decoder.records
    assert sum(r.emitted for r in recs) == len(decoder.output_ids) == recs[-1].new_tokens
    elapsed = [r.elapsed_ms for r in recs]
    assert elapsed == sorted(elapsed)
    assert [r.iteration for r in recs] == list(range(1, len(recs) + 1))
    produced = 0
    for r in recs:
        assert 0 <= r.accepted <= r.lookahead <= max(r.max_lookahead, 0)
        assert r.lookahead <= max_new - produced - 1 or r.lookahead == 0
        assert 1 <= r.emitted <= r.accepted + 1
        assert len(r.confidences) == r.lookahead
        if r.stop_reason == "confidence":
            assert r.min_confidence < r.threshold
            assert r.confidences[-1] < r.threshold
        if r.stop_reason == "max_lookahead":
            assert r.lookahead == r.max_lookahead
        if not math.isnan(r.threshold) and r.lookahead > 1:
            # every drafted token but the last was confident enough to keep drafting
            assert all(c >= r.threshold for c in r.confidences[:-1])
        assert r.iteration_ms >= r.draft_ms >= 0 and r.iteration_ms >= r.verify_ms >= 0
        assert r.forward_ms <= r.iteration_ms + 1e-6
        produced += r.emitted
        assert r.new_tokens == produced
    assert decoder.done


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_trace_invariants(tiny_pair, strategy):
    lanes = ["autoregressive"] + ([strategy] if strategy != "autoregressive" else [])
    final = run_all(tiny_pair, "def main():\n    ", lanes, _greedy(48))
    d = final.decoders[-1]
    _check_invariants(d, 48)
    kinds = {t.source for t in d.tokens}
    if strategy == "autoregressive":
        assert kinds == {"autoregressive"}
    else:
        assert kinds <= {"accepted_draft", "target_correction", "target_bonus"}
        assert len(d.tokens) == len(d.output_ids)
        assert [t.token_id for t in d.tokens] == d.output_ids
        assert [t.position for t in d.tokens] == list(range(len(d.output_ids)))
    summary = final.summaries()[-1]
    assert summary["target_calls"] == len(d.records)
    assert summary["draft_calls"] == sum(r.draft_calls for r in d.records)
    assert summary["new_tokens"] == len(d.output_ids)


def test_oracle_drafts_only_accepted_tokens(tiny_pair):
    final = run_all(tiny_pair, "The quick brown fox", ["autoregressive", "oracle:20"], _greedy(48))
    frame = final.iterations()
    oracle = frame[frame["strategy"] == "oracle:20"]
    assert (oracle["accepted"] == oracle["lookahead"]).all()
    assert (oracle["stop_reason"].isin(["oracle", "max_lookahead", "length", "eos"])).all()


def test_heuristic_schedule_follows_transformers(tiny_pair):
    final = run_all(tiny_pair, "Explain KV caches.", ["heuristic:3"], _greedy(60))
    recs = final.decoders[0].records
    k = 3
    for r in recs:
        assert r.max_lookahead == k
        if r.lookahead:
            k = k + 2 if r.accepted == r.lookahead else max(1, k - 1)


def _fresh_last_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def _cached_last_logits(model, cache, ids: list[int], cached: int) -> torch.Tensor:
    assert cache.get_seq_length() == cached
    cache = copy.deepcopy(cache)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids[cached:]]), cache=cache, use_cache=True)
    return out.logits[0, -1].float()


@pytest.mark.parametrize("strategy", ["static:6", "threshold:0.4:20", "heuristic:2"])
def test_cache_rollback_matches_a_fresh_forward(tiny_pair, strategy):
    """After every iteration (rejections included) both caches equal a fresh pass over the accepted prefix."""
    rejections = 0
    for prompt in PROMPTS[:4]:
        prompt_ids = encode_prompt(tiny_pair, prompt, False, 40)
        d = Decoder(tiny_pair, prompt_ids, parse_strategy(strategy), _greedy(40))
        while not d.done:
            r = d.step()
            if d.done:
                break
            rejections += r.accepted < r.lookahead
            fresh = _fresh_last_logits(tiny_pair.target, d.ids)
            cached = _cached_last_logits(tiny_pair.target, d.target.cache, d.ids, d.t_len)
            torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)
            fresh_a = _fresh_last_logits(tiny_pair.assistant, d.ids)
            cached_a = _cached_last_logits(tiny_pair.assistant, d.assistant.cache, d.ids, d.a_len)
            torch.testing.assert_close(cached_a, fresh_a, atol=1e-4, rtol=1e-4)
    assert rejections > 0


def test_eos_stops_every_strategy_at_the_same_place(tiny_pair):
    ar = run_all(tiny_pair, "def fibonacci(n):", ["autoregressive"], _greedy(40)).decoders[0].output_ids
    stop_token = ar[5]  # pretend a token the target emits early is the end-of-sequence token
    pair = dataclasses.replace(tiny_pair, eos_ids=(stop_token,))
    expected = ar[: ar.index(stop_token) + 1]
    final = run_all(pair, "def fibonacci(n):", STRATEGIES, _greedy(40))
    for d in final.decoders:
        assert d.output_ids == expected, d.strategy
        assert d.finish_reason == "eos"
        _check_invariants(d, 40)


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_never_emits_past_max_new_tokens(tiny_pair, max_new):
    final = run_all(tiny_pair, "Once upon a time", STRATEGIES, _greedy(max_new))
    for d in final.decoders:
        assert len(d.output_ids) == max_new or d.finish_reason == "eos"
        assert len(d.output_ids) <= max_new
        if max_new == 1 and d.policy.uses_assistant:
            assert d.records[0].lookahead == 0 and d.records[0].stop_reason == "length"


def test_sampling_is_reproducible_with_a_seed(tiny_pair):
    settings = DecodeSettings(max_new_tokens=30, sample=True, temperature=1.5, top_p=0.95, seed=7)
    runs = [run_all(tiny_pair, "The quick brown fox", ["autoregressive", "threshold:0.4:20", "static:4"], settings)
            for _ in range(2)]
    for a, b in zip(runs[0].decoders, runs[1].decoders):
        assert a.output_ids == b.output_ids
    others = [run_all(tiny_pair, "The quick brown fox", ["threshold:0.4:20"], dataclasses.replace(settings, seed=s))
              for s in (8, 9, 10)]
    assert any(o.decoders[0].output_ids != runs[0].decoders[1].output_ids for o in others)
    assert all(s["identical_to_autoregressive"] is None for s in runs[0].summaries())


@pytest.mark.parametrize("bad", [
    DecodeSettings(max_new_tokens=0), DecodeSettings(max_new_tokens=-3), DecodeSettings(max_new_tokens=10**6),
    DecodeSettings(sample=True, temperature=0.0), DecodeSettings(sample=True, top_p=0.0),
    DecodeSettings(sample=True, temperature=float("nan")),
])
def test_bad_settings_are_refused(tiny_pair, bad):
    with pytest.raises(InputError):
        run_all(tiny_pair, "hello", ["static:3"], bad)


def test_bad_prompts_are_refused(tiny_pair):
    with pytest.raises(InputError, match="empty"):
        run_all(tiny_pair, "   ", ["static:3"], _greedy(8))
    with pytest.raises(InputError, match="context"):
        run_all(tiny_pair, "a" * 2000, ["static:3"], _greedy(8))
    with pytest.raises(InputError, match="context"):
        run_all(tiny_pair, "a" * 1000, ["static:3"], _greedy(100))
    with pytest.raises(InputError, match="greedy"):
        run_all(tiny_pair, "hello", ["oracle"], DecodeSettings(sample=True))
    with pytest.raises(InputError, match="twice"):
        run_all(tiny_pair, "hello", ["static:3", "static:3"], _greedy(8))


class _StopAfter:
    """An interrupt that fires on its n-th poll (and stays fired)."""

    def __init__(self, n: int):
        self.n, self.polls = n, 0

    def __call__(self) -> bool:
        self.polls += 1
        return self.polls >= self.n


def test_interrupt_is_polled_before_every_pass_and_inside_it(tiny_pair):
    """Polled before each forward pass and by a pre-hook on every transformer layer (2 assistant layers, 6
    target layers in the tiny pair): a static:4 iteration polls 4 x (1 + 2) + (1 + 6) = 19 times."""
    prompt_ids = encode_prompt(tiny_pair, "Once upon a time", False, 32)
    d = Decoder(tiny_pair, prompt_ids, parse_strategy("static:4"), _greedy(32))
    never = _StopAfter(10**9)
    record = d.step(never)
    assert record.lookahead == 4 and never.polls == 19
    assert tiny_pair.target._disco_interrupt_layers == 6 and tiny_pair.assistant._disco_interrupt_layers == 2


@pytest.mark.parametrize("poll", [1, 2, 5, 13, 14, 19])  # before a draft, inside drafts, before/inside verify
def test_interrupt_abandons_the_iteration(tiny_pair, poll):
    """The abandoned iteration leaves no record, no token, and a decoder that refuses to go on (its caches may
    hold unverified drafts or half a pass); the shared models work as before for everyone else."""
    prompt_ids = encode_prompt(tiny_pair, "Once upon a time", False, 32)
    d = Decoder(tiny_pair, prompt_ids, parse_strategy("static:4"), _greedy(32))
    d.step()  # one complete iteration first
    records, tokens, ids = list(d.records), list(d.tokens), list(d.ids)
    interrupt = _StopAfter(poll)
    with pytest.raises(Interrupted):
        d.step(interrupt)
    assert interrupt.polls == poll  # nothing polled it (so nothing ran) after it fired
    assert d.records == records and d.tokens == tokens and d.ids == ids
    with pytest.raises(RuntimeError, match="interrupted"):
        d.step()
    after = run_all(tiny_pair, "Once upon a time", ["autoregressive", "static:4"], _greedy(12))
    assert after.decoders[0].output_ids == after.decoders[1].output_ids


def test_a_never_firing_interrupt_changes_nothing(tiny_pair):
    plain = run_all(tiny_pair, "def f(x):", ["static:3", "threshold:0.4:8"], _greedy(24))
    polled = None
    for polled in race(tiny_pair, "def f(x):", ["static:3", "threshold:0.4:8"], _greedy(24), should_stop=lambda: False):
        pass
    for a, b in zip(plain.decoders, polled.decoders):
        assert a.output_ids == b.output_ids
        assert [(r.lookahead, r.accepted, r.stop_reason) for r in a.records] == \
               [(r.lookahead, r.accepted, r.stop_reason) for r in b.records]


def test_interrupt_while_the_oracle_reference_is_computed(tiny_pair):
    interrupt = _StopAfter(3)
    with pytest.raises(Interrupted):  # raised by race() itself: the reference is computed before any iteration
        race(tiny_pair, "A new prompt for the oracle", ["oracle:6"], _greedy(40), should_stop=interrupt)
    assert interrupt.polls == 3
    final = run_all(tiny_pair, "A new prompt for the oracle", ["autoregressive", "oracle:6"], _greedy(40))
    assert final.decoders[0].output_ids == final.decoders[1].output_ids  # nothing half-computed was memoised


@pytest.mark.parametrize("poll", [1, 7, 8, 60, 200])
def test_interrupted_race_keeps_every_completed_iteration(tiny_pair, poll):
    lanes = ["autoregressive", "static:5", "threshold:0.4:20", "oracle:6"]
    prompt_ids = encode_prompt(tiny_pair, "The quick brown fox", False, 40)
    greedy_reference(tiny_pair, prompt_ids, 40)  # memoised: the polls below all fall inside the race
    interrupt = _StopAfter(poll)
    seen, snapshot = [], None
    for snapshot in race(tiny_pair, "The quick brown fox", lanes, _greedy(40), should_stop=interrupt):
        seen.append(sum(len(d.records) for d in snapshot.decoders))
    assert interrupt.polls == poll  # nothing was polled (so nothing ran) after the request was seen
    assert seen == list(range(1, len(seen) + 1))  # one snapshot per completed iteration
    if snapshot is None:  # stopped inside the first lane's first pass (1 poll before it, one per target layer)
        assert poll <= 1 + tiny_pair.target._disco_interrupt_layers
        return
    assert not snapshot.finished
    for d in snapshot.decoders:
        recs = d.records
        assert sum(r.emitted for r in recs) == len(d.output_ids) == len(d.tokens)
        assert [r.iteration for r in recs] == list(range(1, len(recs) + 1))
    ar = snapshot.decoders[0].output_ids
    for d in snapshot.decoders[1:]:  # every lane's partial text is a prefix of the same greedy output
        n = min(len(ar), len(d.output_ids))
        assert d.output_ids[:n] == ar[:n]


def test_a_finished_decoder_drops_its_kv_caches_at_once(tiny_pair):
    """Decoder.release closes both sessions when the run ends (the session protocol's close): the torch caches go
    now, not when a garbage collection finds the decoder; the output stays."""
    ids = encode_prompt(tiny_pair, PROMPTS[0], False, 12)
    d = Decoder(tiny_pair, ids, parse_strategy("static:3"), _greedy(12)).run()
    assert d.done and d.output_ids
    assert d.target.cache is None and d.assistant.cache is None
