"""Speculative sampling keeps the target's distribution exactly (Leviathan et al.), and this test
is sharp enough to catch a wrong acceptance rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import disco.decode.live as engine
from disco.decode.live import Decoder
from disco.decode.sampling import distribution
from disco.decode.settings import DecodeSettings
from disco.policies import parse_strategy

pytestmark = pytest.mark.slow  # statistical / end-to-end runs: out of the fast tier (./test.sh -m fast)

PROMPT = [1, 2, 3]
NEW = 3          # tokens per sample: two drafts + the bonus, or a rejection and a fresh iteration
SAMPLES = 3000
SETTINGS = dict(max_new_tokens=NEW, sample=True, temperature=1.0, top_p=1.0)


def exact_joint(pair, settings: DecodeSettings, prompt: list[int] = PROMPT) -> dict[tuple, float]:
    """The target's own distribution over every continuation of NEW tokens, by enumeration."""
    vocab = pair.target.config.vocab_size
    probs = {}
    with torch.inference_mode():
        for seq in itertools.product(range(vocab), repeat=NEW):
            ids = torch.tensor([prompt + list(seq)])
            logits = pair.target(input_ids=ids, use_cache=False).logits[0]
            dist = distribution(logits[len(prompt) - 1: len(prompt) - 1 + NEW], settings)
            probs[seq] = float(np.prod([dist[i, t].item() for i, t in enumerate(seq)]))
    total = sum(probs.values())
    assert abs(total - 1.0) < 1e-4
    return probs


def sample_counts(pair, settings: DecodeSettings, strategy: str,
                  prompt: list[int] = PROMPT, drafters: set | None = None) -> tuple[dict[tuple, int], float]:
    counts: dict[tuple, int] = {}
    drafted = accepted = 0
    for seed in range(SAMPLES):
        d = Decoder(pair, prompt, parse_strategy(strategy), DecodeSettings(**{**SETTINGS, "seed": seed,
                                                                                "temperature": settings.temperature,
                                                                                "top_p": settings.top_p}))
        d.run()
        key = tuple(d.output_ids)
        counts[key] = counts.get(key, 0) + 1
        drafted += sum(r.lookahead for r in d.records)
        accepted += sum(r.accepted for r in d.records)
        if drafters is not None:
            drafters |= {r.drafter for r in d.records if r.lookahead}
    return counts, accepted / max(drafted, 1)


def p_value(counts: dict[tuple, int], probs: dict[tuple, float]) -> float:
    keys = sorted(probs)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    expected = np.array([probs[k] for k in keys], dtype=float)
    expected = expected / expected.sum() * observed.sum()
    # pool the rare cells so the chi-square approximation holds (expected >= 5 per bin)
    order = np.argsort(expected)
    obs_bins, exp_bins, o_acc, e_acc = [], [], 0.0, 0.0
    for i in order:
        o_acc += observed[i]
        e_acc += expected[i]
        if e_acc >= 5:
            obs_bins.append(o_acc)
            exp_bins.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc > 0:
        obs_bins[-1] += o_acc
        exp_bins[-1] += e_acc
    exp_bins = np.array(exp_bins) * (sum(obs_bins) / sum(exp_bins))  # exact totals for scipy's check
    return float(chisquare(obs_bins, exp_bins).pvalue)


@pytest.mark.parametrize("strategy,temperature,top_p", [
    ("static:2", 1.0, 1.0),
    ("threshold:0.5:2", 1.0, 1.0),
    ("static:2", 0.7, 0.9),
    ("entropy:0.55:2", 1.0, 1.0),     # drops a drafted token whose distribution is too flat (its q row too)
    ("cumulative:0.3:2", 1.0, 1.0),
])
def test_speculative_sampling_keeps_the_target_distribution(small_pair, strategy, temperature, top_p):
    settings = DecodeSettings(**{**SETTINGS, "temperature": temperature, "top_p": top_p})
    probs = exact_joint(small_pair, settings)
    counts, acceptance = sample_counts(small_pair, settings, strategy)
    # the pair must disagree often, or the rejection path would hardly be tested
    assert 0.2 < acceptance < 0.9
    assert p_value(counts, probs) > 1e-3


def _resample_from_target(p, q, drafts, generator):
    """A classic bug: after a rejection, sample from p instead of the residual max(0, p - q)."""
    for i, token in enumerate(drafts):
        if torch.rand((), generator=generator) <= p[i, token] / q[i, token]:
            continue
        return i, int(torch.multinomial(p[i], 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


def _accept_everything(p, q, drafts, generator):
    """Another bug: trust the assistant; the output then follows q, not p."""
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


@pytest.mark.parametrize("wrong_rule", [_resample_from_target, _accept_everything])
def test_a_wrong_acceptance_rule_fails_the_test(small_pair, monkeypatch, wrong_rule):
    settings = DecodeSettings(**SETTINGS)
    probs = exact_joint(small_pair, settings)
    monkeypatch.setattr(engine, "speculative_accept", wrong_rule)
    counts, _ = sample_counts(small_pair, settings, "static:2")
    assert p_value(counts, probs) < 1e-6


@pytest.mark.parametrize("strategy", ["lookup:2", "copy:4:1", "suffix:2:0.1:4"])
def test_prompt_lookup_sampling_keeps_the_target_distribution(small_pair, strategy):
    """A copied draft is a point mass: the Leviathan rule with q = one-hot must still give the target's law."""
    prompt = [2, 2, 2, 2, 0, 2, 2]  # "2 2" recurs: every iteration copies a draft the target often (not always) takes
    settings = DecodeSettings(**SETTINGS)
    probs = exact_joint(small_pair, settings, prompt)
    counts, acceptance = sample_counts(small_pair, settings, strategy, prompt)
    assert 0.1 < acceptance < 0.95
    assert p_value(counts, probs) > 1e-3


@pytest.mark.parametrize("strategy", ["hybrid:lookup:2:1+static:2", "hybrid:ngram:1:2+threshold:0.5:2"])
def test_hybrid_sampling_keeps_the_target_distribution(small_pair, strategy):
    """A hybrid verifies copied drafts (a point mass) and the assistant's (its q rows) in one run: both must keep the
    target's law, and both must have drafted in the samples."""
    prompt = [2, 2, 0, 1, 2, 3]  # a match for some continuations, none for others
    settings = DecodeSettings(**SETTINGS)
    probs = exact_joint(small_pair, settings, prompt)
    used: set = set()
    counts, acceptance = sample_counts(small_pair, settings, strategy, prompt, used)
    assert used == {"lookup", "assistant"}
    assert 0.1 < acceptance < 0.95
    assert p_value(counts, probs) > 1e-3


def test_a_wrong_point_mass_rule_fails_too(small_pair, monkeypatch):
    """Accepting every copied token (trusting the copy) must fail the same test."""
    prompt = [2, 2, 2, 2, 0, 2, 2]
    settings = DecodeSettings(**SETTINGS)
    probs = exact_joint(small_pair, settings, prompt)
    monkeypatch.setattr(engine, "speculative_accept", _accept_everything)
    counts, _ = sample_counts(small_pair, settings, "lookup:2", prompt)
    assert p_value(counts, probs) < 1e-6


def test_autoregressive_sampling_matches_too(small_pair):
    settings = DecodeSettings(**SETTINGS)
    probs = exact_joint(small_pair, settings)
    counts, _ = sample_counts(small_pair, settings, "autoregressive")
    assert p_value(counts, probs) > 1e-3
