"""Settings to take away (``disco.policies.export``): the transformers fields are accepted by GenerationConfig and
run generate, llama.cpp flags are the vendored version's, vLLM's config is well formed; the profile carries them."""

from __future__ import annotations

import json

import pytest
from transformers import GenerationConfig

from disco.policies import parse_strategy
from disco.policies.export import ENGINES, take_away, take_away_md

SPECS = ["static:3", "threshold:0.4:20", "adaptive:0.4:20", "heuristic:5", "pmin:0.4:3", "lookup:10", "lookup:4:3",
         "copy:16:3", "costaware:8", "entropy:0.5:8", "autoregressive", "oracle"]


@pytest.mark.parametrize("spec", SPECS)
def test_every_engine_gets_a_config_or_a_reason(spec):
    out = take_away(parse_strategy(spec))
    assert out["spec"] == parse_strategy(spec).spec
    for engine in ENGINES:
        e = out[engine]
        assert e["config"] is not None or e["note"], (spec, engine)
        assert e["exact"] in (True, False) and (e["exact"] is False or e["config"] is not None)
    assert take_away_md(out).startswith(f"**Take `{out['spec']}`")


@pytest.mark.parametrize("spec", [s for s in SPECS if s != "oracle"])
def test_transformers_fields_are_accepted_by_generation_config(spec):
    fields = take_away(parse_strategy(spec))["transformers"]["config"]
    config = GenerationConfig(do_sample=False, **fields)
    config.validate(strict=True)
    for key, value in fields.items():
        assert getattr(config, key) == value


def test_exact_mappings_are_the_policies_own_transformers_arguments():
    for spec in ("static:3", "threshold:0.4:20", "lookup:10"):
        policy = parse_strategy(spec)
        e = take_away(policy)["transformers"]
        assert e["exact"] and e["config"] == policy.hf_kwargs()
    assert not take_away(parse_strategy("pmin:0.4:3"))["transformers"]["exact"]  # transformers keeps the token


def test_the_exported_prompt_lookup_runs_transformers_generate(tiny_pair):
    """The lookup fields drive transformers' own generate to the text DISCO Lab's lane produces."""
    import torch

    from disco.bench.peer import run_ours
    from disco.models import encode_prompt

    policy = parse_strategy("lookup:4:2")
    fields = take_away(policy)["transformers"]["config"]
    ids = encode_prompt(tiny_pair, "a b c a b c a", False, 24)
    out = tiny_pair.target.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=24, do_sample=False, pad_token_id=tiny_pair.eos_ids[0],
                                    eos_token_id=list(tiny_pair.eos_ids), **fields)
    text = out[0, len(ids):].tolist()
    ours = run_ours(tiny_pair, ids, policy, 24)["output_ids"]
    assert text[: len(ours)] == ours


def test_llama_flags_are_the_vendored_llama_cpps():
    """The flags are those of the llama.cpp llama-cpp-python 0.3.36 vendors (read in its common/arg.cpp)."""
    known = {"--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min",
             "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"}
    for spec in SPECS:
        flags = take_away(parse_strategy(spec))["llama.cpp"]["config"] or []
        assert {f for f in flags if f.startswith("--")} <= known, spec
        if "--spec-type" in flags:
            assert flags[flags.index("--spec-type") + 1] in ("draft-simple", "ngram-simple")
    pmin = take_away(parse_strategy("pmin:0.3:5:2"))["llama.cpp"]
    assert pmin["exact"] and pmin["config"] == parse_strategy("pmin:0.3:5:2").llama_args()
    assert "dropped, not sent" in take_away(parse_strategy("threshold:0.4:20"))["llama.cpp"]["note"]


def test_vllm_config_and_the_batch_size_table():
    table = [[1, 3, 4], [4, 15, 2], [16, 64, 0]]
    v = take_away(parse_strategy("static:4"), table)["vllm"]
    assert v["config"]["num_speculative_tokens"] == 4 and v["config"]["num_speculative_tokens_per_batch_size"] == table
    assert json.loads(v["text"].split("'")[1]) == v["config"]
    thr = take_away(parse_strategy("threshold:0.4:20"), table)["vllm"]
    assert thr["config"]["num_speculative_tokens"] == 4 and not thr["exact"]  # no confidence stop in vLLM
    # vLLM caps every batch size at num_speculative_tokens: a smaller static K caps the modelled table, never 0 as K
    small = take_away(parse_strategy("static:2"), table)["vllm"]["config"]
    assert small["num_speculative_tokens"] == 2 and small["num_speculative_tokens_per_batch_size"] == [[1, 15, 2], [16, 64, 0]]
    off = take_away(parse_strategy("threshold:0.4:8"), [[1, 64, 0]])["vllm"]
    assert off["config"]["num_speculative_tokens"] == 8 and "does not pay here at any batch size" in off["note"]
    ngram = take_away(parse_strategy("lookup:8:3"))["vllm"]["config"]
    assert ngram == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_the_profile_batch_table_is_well_formed():
    """Profile.batch_table: contiguous [first, last, K] rows from batch 1, K within range, 0 where it stops paying."""
    from disco.costs.profile import Profile

    prof = Profile(key={"models": "x"}, dtype="fp32", decision=None,
                   target_ms={1: 10.0, 2: 11.0, 4: 12.0, 8: 14.0, 16: 20.0, 32: 40.0, 64: 80.0},
                   target_prefill_ms={128: 160.0, 256: 320.0}, assistant_ms={"model": {1: 1.0, 2: 1.1, 4: 1.3}},
                   assistant_prefill_ms={"model": {64: 8.0}}, acceptance={"model": 0.8})
    table = prof.batch_table("model")
    assert table[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(table, table[1:]))
    assert all(0 <= k <= 16 for _, _, k in table) and table[0][2] >= 2  # flat verification at batch 1: K pays
    assert table[-1][2] <= table[0][2]  # a full batch leaves nothing to hide verification in
    prof.recommended = {"auto": "static:4@model", "auto_speedup": 1.5, "speculation_pays": True}
    (entry,) = prof.take_away()
    capped = [[a, b, min(k, 4)] for a, b, k in table]  # static:4 drafts at most 4 at any batch size
    merged = [r for i, r in enumerate(capped) if i == 0 or r[2] != capped[i - 1][2]]
    for i, r in enumerate(merged):
        r[1] = (merged[i + 1][0] - 1) if i + 1 < len(merged) else capped[-1][1]
    assert entry["setting"] == "static:4@model" and entry["vllm"]["config"]["num_speculative_tokens_per_batch_size"] == merged
