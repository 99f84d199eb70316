"""Drafting for free inside a batch (``free:SPEC``, disco.replay.free_draft): B = 1 is SPEC itself, every row drafts
the batch's depth, the output stays the target's, and a cached table's chain bounds the extension."""

from __future__ import annotations

import pytest

from disco.costs.batched import FlatBatch, TokenCurve
from disco.replay.batched import BatchReplayError, Request, Setting, simulate
from disco.replay.layouts import Pricer
from disco.replay.tables import Chain, ReplayTable

from test_batched import CURVE, EOS, synthetic_table

SPEC = "threshold:0.6:12"


def _stream(n=6, seed=0):
    return [Request(i, synthetic_table(seed + i)) for i in range(n)]


def _iterations(log):
    return [it[1:] for it in log.iterations]  # (rows, emitted, draft ms, verify ms, target tokens, draft passes)


@pytest.mark.parametrize("spec", [SPEC, "pmin:0.6:3", "entropy:0.8:12", "cumulative:0.3:12"])
def test_free_at_batch_one_is_the_rule_itself(spec):
    # the deepest row always runs its own rule (pmin's dropped last token stays dropped): at B = 1 that is every row
    pricer = Pricer(TokenCurve(CURVE), "ragged")
    plain = simulate(spec, _stream(), 1, pricer, 20)
    free = simulate(f"free:{spec}", _stream(), 1, pricer, 20)
    assert _iterations(free) == _iterations(plain)
    assert free.output == plain.output


def test_free_rows_draft_the_batch_depth_and_keep_the_target_output():
    pricer = Pricer(TokenCurve(CURVE), "ragged")
    plain = simulate(SPEC, _stream(), 3, pricer, 20)
    free = simulate(f"free:{SPEC}", _stream(), 3, pricer, 20)
    references = {i: synthetic_table(i).reference_for(20) for i in range(6)}
    assert free.output == plain.output == {i: ref[: len(free.output[i])] for i, ref in references.items()}
    # the same drafting passes are paid for, more of them verified: at least as many tokens sent to the target, and
    # no more iterations (extra drafts can only be accepted, never cost a token)
    assert sum(it[5] for it in free.iterations) > sum(it[5] for it in plain.iterations)
    assert len(free.iterations) <= len(plain.iterations)


def test_a_row_drafts_to_the_depth_asked_and_the_dry_run_leaves_it_untouched():
    from disco.policies import parse_strategy
    from disco.replay import free_draft
    from disco.replay.run import ReplayRun

    run = ReplayRun(synthetic_table(7), parse_strategy(SPEC), 20)
    own, exact = free_draft.own_depth(run)
    assert exact and run.records == [] and run.core.out_len == 0  # the dry run stepped a copy
    record = free_draft.step_to_depth(run, own + 3)
    assert record.draft_calls == record.lookahead == own + 3  # past its own stop, every draft kept and verified
    assert run.core.policy is run.policy  # the rule is back for the next iteration


def test_free_costs_nothing_more_to_verify_when_padded_to_k():
    # padded-k verifies K + 1 a row whatever it drafted: the extension's drafts ride in the padding
    pricer = Pricer(FlatBatch(0.1), "padded-k")
    plain = simulate(SPEC, _stream(), 4, pricer, 20)
    free = simulate(f"free:{SPEC}", _stream(), 4, pricer, 20)
    assert free.iterations[-1][0] <= plain.iterations[-1][0]


def _holding(table: ReplayTable, positions: dict[int, int]) -> ReplayTable:
    """``table`` as a cache without its models would hold it: the chain at each listed position cut to that many
    tokens, no chain at any other."""
    chains = {p: Chain(table.chains[p].tokens[:n], table.chains[p].probs[:n], False, [1.0] * n, [0.5] * n,
                       [0.9] * n) for p, n in positions.items()}
    return ReplayTable(table.prompt_ids, table.reference, table.max_new_tokens, [EOS], chains,
                       meta={"models": "synthetic"})


def test_a_cached_chain_bounds_the_draft_and_is_counted():
    # a cache that holds 2 tokens at every position (a rule that never drafted deeper built it), and one that holds
    # nothing past position 0: rows draft what their tables hold, never fail, and the cut rows are counted
    full = synthetic_table(3)
    two = _holding(full, {p: 2 for p in full.chains})
    first_only = _holding(synthetic_table(4), {0: 3})
    pricer = Pricer(FlatBatch(0.1), "padded-k")
    log = simulate(f"free:{SPEC}", [Request(0, two), Request(1, first_only)], 2, pricer, 16)
    for i, table in ((0, two), (1, first_only)):
        assert log.output[i] == table.reference_for(16)[: len(log.output[i])]
    assert log.cut > 0
    # alone in its batch (B = 1) too: its own rule is cut where the chain ends
    assert simulate(f"free:{SPEC}", [Request(1, first_only)], 1, pricer, 16).cut > 0


@pytest.mark.parametrize("spec", ["free:sglang:3", "free:lookup:3", "free:oracle:8", "free:autoregressive"])
def test_free_takes_a_per_sequence_assistant_rule(spec):
    with pytest.raises(BatchReplayError):
        Setting(spec)


def test_the_extension_keeps_the_rules_kmax_for_padding():
    from disco.replay.batched import _row_of
    from disco.policies import parse_strategy
    from disco.replay.run import ReplayRun

    run = ReplayRun(synthetic_table(5), parse_strategy(SPEC), 20)
    row, _ = _row_of(run, 2)
    assert row.k_config == 12 and row.draft_calls == 2


def test_free_names_itself_canonically():
    assert Setting("free:threshold:0.4:20").spec == "free:threshold:0.4:20"
    assert not Setting("free:threshold:0.4:20").cacheable


def test_every_rules_stop_checks_only_read_its_state():
    """free:'s dry run shares the rule's state with the row (disco.replay.free_draft._probe): a rule's drop and
    stop_after must read it only (update, after verification, is where it changes)."""
    import copy

    from disco.policies import DraftStep, RunContext, parse_strategy, policy_kinds

    for cls in policy_kinds():
        policy = parse_strategy(cls.canonical)
        if not policy.uses_assistant:
            continue
        policy.bind(RunContext(costs=CURVE, reference=[1, 2, 3]))
        before = copy.deepcopy(vars(policy))
        step = DraftStep.first(0, 5, 0.3, 2.0, 0.1, 0.6)
        for s in (step, step.then(6, 0.9, 0.2, 0.8, 0.99), step.then(7, 0.01, 5.0, 0.0, 0.2)):
            policy.drop(s)
            policy.stop_after(s)
        assert _state(vars(policy)) == _state(before), cls.kind


def _state(value):
    """A structure's value, objects compared by their attributes (not their addresses)."""
    if isinstance(value, dict):
        return {k: _state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_state(v) for v in value]
    if hasattr(value, "__dict__") and not callable(value):
        return (type(value).__name__, _state(vars(value)))
    return repr(value)
