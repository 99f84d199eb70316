"""Prompt-lookup drafting (``lookup``, ``copy``): transformers' matching rule, lossless greedy decoding on both
engines, live = replay, and transformers' own prompt-lookup generate as the peer (text and target passes)."""

from __future__ import annotations

import random

import pytest
import torch

from disco.decode.live import Decoder
from disco.decode.race import run_all
from disco.decode.settings import DecodeSettings
from disco.policies import parse_strategy
from disco.policies.lookup import copied, evidence, find_match
from disco.replay.run import replay
from disco.replay.tables import build_table

PROMPTS = ["def f(x):\n    return x + 1\n\ndef g(x):\n    return", "a b c a b c a b", "The cat sat. The cat",
           "x = [1, 2, 3]\ny = [1, 2,", "Once upon a time"]


def _transformers_draft(ids: list[int], k: int, ngram: int, eos: list[int]) -> list[int]:
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = PromptLookupCandidateGenerator(eos_token_id=torch.tensor(eos), num_output_tokens=k,
                                         max_matching_ngram_size=ngram, max_length=len(ids) + 1000)
    out, _ = gen.get_candidates(torch.tensor([ids]))
    return out[0, len(ids):].tolist()


def _ours(ids, k, ngram, eos):
    match = find_match(ids, ngram)
    return copied(ids, match[0], k, set(eos)) if match else []


@pytest.mark.parametrize("seed", range(300))
def test_the_match_is_transformers_prompt_lookup(seed):
    """Random short contexts over a small vocabulary (many repeats, EOS inside copies): our draft is exactly the
    candidates transformers' PromptLookupCandidateGenerator proposes."""
    rng = random.Random(seed)
    ids = [rng.randrange(5) for _ in range(rng.randrange(1, 40))]
    k, ngram = rng.randrange(1, 12), rng.randrange(1, 5)
    eos = [4] if seed % 3 else [9]
    assert _ours(ids, k, ngram, eos) == _transformers_draft(ids, k, ngram, eos), (ids, k, ngram)


def test_hand_made_matches():
    ids = [7, 1, 2, 3, 9, 1, 2, 5, 1, 2]
    assert find_match(ids, 2) == (3, 2)           # the earliest "1 2", not the latest
    assert _ours(ids, 2, 2, []) == [3, 9]
    assert _ours(ids, 8, 2, [9]) == [3]             # cut before EOS
    assert _ours([1, 2, 3], 4, 2, []) == []         # nothing earlier matches
    assert find_match([5, 5], 3) == (1, 1)          # n limited by the context
    assert evidence([4, 1, 2, 3, 8, 4, 1, 2], 3) == 3  # "4 1 2" agrees backwards from the match
    copy = parse_strategy("copy:16")
    assert copy.propose([4, 1, 2, 3, 8, 4, 1, 2], 16, set()) == [3, 8, 4]  # three tokens of evidence, three copied
    assert parse_strategy("copy:16:4").propose([4, 1, 2, 3, 8, 4, 1, 2], 16, set()) == []  # too little evidence
    assert parse_strategy("lookup:16").propose([4, 1, 2, 3, 8, 4, 1, 2], 16, set()) == [3, 8, 4, 1, 2]


@pytest.mark.parametrize("chat", [False, True])
def test_lookup_lanes_are_lossless_and_draft_something(tiny_pair, chat):
    drafted = accepted = 0
    for prompt in PROMPTS:
        final = run_all(tiny_pair, prompt, ["autoregressive", "lookup:4", "lookup:10:3", "copy:16", "copy:8:1", "copy:32:3"],
                        DecodeSettings(max_new_tokens=40), chat=chat)
        base = final.decoders[0].output_ids
        for d in final.decoders[1:]:
            assert d.output_ids == base, f"{d.strategy} diverged on {prompt!r}"
            assert all(r.draft_calls == 0 and r.drafter == "lookup" for r in d.records)  # no assistant pass
            assert d.assistant_tokens == 0
            drafted += sum(r.lookahead for r in d.records)
            accepted += sum(r.accepted for r in d.records)
            for r in d.records:
                assert r.lookahead <= r.max_lookahead and r.confidences == [1.0] * r.lookahead
                assert r.stop_reason in ("source", "max_lookahead", "length")
    assert drafted > 0 and 0 < accepted < drafted  # both outcomes exercised


def test_replay_of_lookup_is_the_live_run(tiny_pair):
    from disco.models import encode_prompt

    for prompt in PROMPTS:
        ids = encode_prompt(tiny_pair, prompt, False, 40)
        table = build_table(tiny_pair, ids, 40)
        for spec in ("lookup:4", "lookup:10:3", "copy:16"):
            live = Decoder(tiny_pair, ids, parse_strategy(spec), DecodeSettings(max_new_tokens=40)).run()
            rep = replay(table, parse_strategy(spec), 40)
            assert rep.output_ids == live.output_ids
            assert [(r.lookahead, r.accepted, r.emitted, r.stop_reason) for r in rep.records] == \
                [(r.lookahead, r.accepted, r.emitted, r.stop_reason) for r in live.records]


@pytest.mark.parametrize("spec", ["lookup:4", "lookup:10", "lookup:3:1", "lookup:8:4"])
def test_transformers_prompt_lookup_generate_is_the_peer(tiny_pair, spec):
    """transformers' generate(prompt_lookup_num_tokens=K, max_matching_ngram_size=N) makes the same text with the
    same number of target passes."""
    from disco.bench.peer import run_hf, run_ours
    from disco.models import encode_prompt

    for prompt in PROMPTS:
        ids = encode_prompt(tiny_pair, prompt, False, 32)
        ours = run_ours(tiny_pair, ids, parse_strategy(spec), 32)
        hf = run_hf(tiny_pair, ids, parse_strategy(spec), 32)
        assert hf["output_ids"] == ours["output_ids"], prompt
        assert hf["target_passes"] == len(ours["records"]), prompt
        assert hf["assistant_passes"] == 0


def test_bad_lookup_specs_are_refused():
    from disco.policies import StrategyError

    for spec, needle in (("lookup", "unknown strategy"), ("lookup:0", "K must be between"),
                         ("lookup:4:0", "NGRAM must be between"), ("copy:4@int8", "uses no assistant"),
                         ("lookup:x", "must be an integer")):
        with pytest.raises(StrategyError, match=needle):
            parse_strategy(spec)
