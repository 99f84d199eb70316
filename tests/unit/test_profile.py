"""The machine's cost profile: schema, derived numbers, cache, the `auto` lane, and the CLI."""

from __future__ import annotations

import json

import pytest

from disco.bench import machine_profile as profile
from disco.costs.profile import auto_policy
from disco.policies import parse_strategy

TOP_KEYS = {"format", "key", "machine", "dtype", "decision", "target_ms", "target_prefill_ms", "assistant_ms",
            "assistant_prefill_ms", "cost_ratio", "acceptance", "replay", "leviathan", "recommended", "prompts",
            "max_new_tokens", "seconds", "measured_at"}


@pytest.fixture(scope="module")
def tiny_profile(tiny_pair):
    return profile.measure(tiny_pair, "tiny", prompts=("code-complete-fib",), max_new_tokens=12, reps=1)


def test_profile_schema_and_round_trip(tiny_profile):
    data = json.loads(json.dumps(tiny_profile.to_dict()))
    assert TOP_KEYS <= set(data)
    assert sorted(int(n) for n in data["target_ms"]) == list(range(1, 34))
    assert set(data["assistant_ms"]) == {"model", "int8"}
    assert all(data["cost_ratio"][p] > 0 for p in ("model", "int8"))
    assert 0 <= data["acceptance"]["model"] <= 1
    assert len(data["leviathan"]["int8"]) == 32 and {"k", "speedup_measured_verify"} <= set(data["leviathan"]["int8"][0])
    back = profile.Profile.from_dict(data)
    assert back.target_ms == tiny_profile.target_ms and back.recommended == tiny_profile.recommended


def test_recommendation_is_a_runnable_lane(tiny_profile):
    rec = tiny_profile.recommended
    policy = parse_strategy(rec["best_speculative"])
    assert policy.assistant_precision in ("model", "int8") and policy.kind in ("static", "threshold")
    best = max(v for p in tiny_profile.replay.values() for s, v in p.items() if s != "autoregressive")
    assert rec["best_speculative_speedup"] == pytest.approx(best)
    if rec["speculation_pays"]:
        assert rec["auto"] == rec["best_speculative"] and rec["auto_speedup"] == pytest.approx(best)
    else:
        assert rec["auto"] == "autoregressive" and rec["auto_speedup"] == 1.0
    assert auto_policy(tiny_profile).spec == rec["auto"]
    for p, entry in rec["by_precision"].items():
        assert entry["static_speedup"] == max(v for s, v in tiny_profile.replay[p].items() if s.startswith("static:"))


def test_where_speculation_loses_the_recommendation_is_the_target_alone(tiny_profile):
    import dataclasses

    losing = {p: {s: (0.9 if s != "autoregressive" else 1.0) for s in t} for p, t in tiny_profile.replay.items()}
    winning = {p: {s: (1.2 if s == "static:2" else 0.9) for s in t} for p, t in tiny_profile.replay.items()}
    rec = dataclasses.replace(tiny_profile, replay=losing).recommend()
    assert rec["auto"] == "autoregressive" and rec["auto_speedup"] == 1.0 and rec["speculation_pays"] is False
    assert rec["best_speculative_speedup"] == pytest.approx(0.9)
    rec = dataclasses.replace(tiny_profile, replay=winning).recommend()
    assert rec["auto"].startswith("static:2@") and rec["speculation_pays"] is True


def test_leviathan_uses_the_measured_verification_cost(tiny_profile):
    p = tiny_profile
    row = p.leviathan("model")[3]  # K = 4
    a, t1 = p.assistant_ms["model"][1], p.target_ms[1]
    tokens = (1 - p.acceptance["model"] ** 5) / (1 - p.acceptance["model"])
    assert row["speedup_measured_verify"] == pytest.approx(tokens * t1 / (p.target_ms[5] + 4 * a))
    assert row["speedup_flat_verify"] == pytest.approx(tokens / (1 + 4 * a / t1))


def test_cost_rows_cover_every_pass(tiny_profile):
    rows = tiny_profile.cost_rows()
    assert {(r["role"], r["precision"]) for r in rows} == {("target", "fp32"), ("assistant", "model"), ("assistant", "int8")}
    assert all(r["ms"] > 0 for r in rows)


def test_cache_round_trip_and_key(tiny_profile, tiny_pair, tmp_path):
    assert profile.load_cached("tiny", tiny_pair, tiny_profile.prompts, 12, tmp_path) is None
    profile.save(tiny_profile, tmp_path)
    got = profile.load_cached("tiny", tiny_pair, tiny_profile.prompts, 12, tmp_path)
    assert got is not None and got.recommended == tiny_profile.recommended
    assert profile.load_cached("tiny", tiny_pair, tiny_profile.prompts, 13, tmp_path) is None  # other length
    assert profile.get(tiny_pair, "tiny", root=tmp_path, prompts=tiny_profile.prompts, max_new_tokens=12).measured_at \
        == tiny_profile.measured_at  # served from the cache, not measured again


def test_auto_without_a_profile_is_a_clear_error():
    with pytest.raises(profile.ProfileError, match="python -m disco profile"):
        auto_policy(None)


def test_lock_and_stop_are_honoured(tiny_pair):
    from disco.errors import Interrupted

    entered = []

    class Lock:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    calls = iter(range(10**6))
    with pytest.raises(Interrupted):
        profile.measure(tiny_pair, "tiny", prompts=("code-complete-fib",), max_new_tokens=4, reps=1, lock=Lock(),
                        should_stop=lambda: next(calls) >= 3)
    assert len(entered) == 3


def test_a_quick_first_look_comes_before_the_full_profile(tiny_pair):
    quick = profile.measure(tiny_pair, "tiny", prompts=("code-complete-fib", "explain-kv-cache"), max_new_tokens=8,
                            quick=True)
    assert quick.preliminary and sorted(quick.target_ms) == list(profile.QUICK_SIZES)
    assert quick.prompts == ["code-complete-fib"] and "auto" in quick.recommended  # already a usable recommendation
    assert "quick first look" in __import__("disco.app.machine_tab", fromlist=["markdown"]).markdown(
        quick.to_dict(), None, "target: ...", None, None)
