"""Assistant precision: an int8 assistant changes what is drafted and what it costs, never the output."""

from __future__ import annotations

import pytest
import torch

from disco.models import precision as prec
from disco.decode.settings import DecodeSettings
from disco.models import resolve_assistant
from disco.policies import StrategyError, parse_strategy
from disco.decode.race import run_all

SPECULATIVE = ["static:1", "static:4", "heuristic:2", "threshold:0.4:20", "threshold:0.9:3", "oracle:6"]
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "SELECT * FROM users WHERE", "x"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_strategy_is_lossless_with_either_assistant(tiny_pair, prompt):
    lanes = ["autoregressive"] + [f"{s}@{p}" for s in SPECULATIVE for p in prec.PRECISIONS]
    final = run_all(tiny_pair, prompt, lanes, DecodeSettings(max_new_tokens=40))
    base = final.decoders[0].output_ids
    for d in final.decoders[1:]:
        assert d.output_ids == base, f"{d.strategy} diverged from autoregressive on {prompt!r}"
    rows = final.export_iterations()
    for lane in lanes[1:]:
        want = lane.rsplit("@", 1)[1]
        assert set(rows.loc[rows["strategy"] == lane, "assistant_precision"]) == {want}
    assert set(rows.loc[rows["strategy"] == "autoregressive", "assistant_precision"]) == {"none"}
    summaries = {s["strategy"]: s for s in final.summaries()}
    assert summaries["static:4@int8"]["assistant_precision"] == "int8"


def test_the_int8_assistant_drafts_differently_but_agrees_often(tiny_pair):
    """Quantization must really happen (else the lanes above prove nothing) and keep a usable draft."""
    final = run_all(tiny_pair, "def fibonacci(n):", ["static:4@model", "static:4@int8"], DecodeSettings(max_new_tokens=48))
    model, int8 = final.decoders
    confs = lambda d: [c for r in d.records for c in r.confidences]
    assert confs(model) != confs(int8)
    s = {x["strategy"]: x for x in final.summaries()}
    assert s["static:4@int8"]["acceptance_rate"] > 0.3


def test_int8_is_quantized_once_and_leaves_the_model_assistant_alone(tiny_pair):
    a = tiny_pair.with_assistant("int8")
    b = tiny_pair.with_assistant("int8")
    assert a is b and a.target is tiny_pair.target and a.tokenizer is tiny_pair.tokenizer
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    assert not any(type(m) is torch.nn.Linear for m in a.assistant.modules())
    assert sum(isinstance(m, DynamicInt8Linear) for m in a.assistant.modules()) > 0
    assert all(type(m) is torch.nn.Linear for m in tiny_pair.assistant.modules() if "Linear" in type(m).__name__)
    assert a.with_assistant("model") is tiny_pair
    assert a.describe()["assistant_precision"] == "int8" and tiny_pair.describe()["assistant_precision"] == "model"


def test_sampling_with_the_int8_assistant_is_reproducible(tiny_pair):
    settings = DecodeSettings(max_new_tokens=24, sample=True, temperature=0.8, seed=7)
    runs = [run_all(tiny_pair, "Once upon a time", ["static:3@int8"], settings).decoders[0].output_ids for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("spec,message", [
    ("static:5@fp8", "unknown assistant precision"),
    ("autoregressive@int8", "uses no assistant"),
    ("threshold:0.4:20@", "unknown assistant precision"),
])
def test_bad_precision_suffixes(spec, message):
    with pytest.raises(StrategyError, match=message):
        parse_strategy(spec)


def test_suffix_parses_and_keeps_the_spec():
    p = parse_strategy(" threshold:0.3:8@INT8 ")
    assert p.spec == "threshold:0.3:8@INT8" and p.assistant_precision == "int8" and p.tau == 0.3 and p.k == 8
    assert parse_strategy("static:2").assistant_precision is None


def test_precision_names_and_devices():
    assert prec.check(" Int8 ") == "int8"
    with pytest.raises(prec.PrecisionError, match="CPU only"):
        prec.check("int8", torch.device("cuda"))
    with pytest.raises(prec.PrecisionError, match="unknown"):
        prec.check("auto")
    assert prec.check("auto", allow_auto=True) == "auto"


def test_auto_assistant_for_the_tiny_pair_is_the_model_one(tiny_pair):
    assert resolve_assistant(tiny_pair, "auto") is tiny_pair
    assert resolve_assistant(tiny_pair, "int8").assistant_precision == "int8"


def test_replay_tables_are_kept_apart_per_assistant_precision(tiny_pair, tmp_path):
    """An int8 and a bf16/fp32 assistant draft different chains: a table built with one must never
    serve the other (it once did, so the model-assistant benchmark replayed int8 chains)."""
    from disco.models import encode_prompt
    from disco.policies import parse_strategy
    from disco.replay.run import replay
    from disco.replay.tables import build_table, table_key

    ids = encode_prompt(tiny_pair, "def fibonacci(n):", False, 24)
    int8 = tiny_pair.with_assistant("int8")
    assert table_key(tiny_pair, ids) != table_key(int8, ids)
    tables = {p: build_table(pair, ids, 24, tmp_path, name="p") for p, pair in (("model", tiny_pair), ("int8", int8))}
    assert tables["model"].path != tables["int8"].path
    for table in tables.values():
        replay(table, parse_strategy("static:4"), 24)
    chains = {p: [t.draft(q, 0)[1] for q in range(20)] for p, t in tables.items()}
    assert chains["model"] != chains["int8"]


@pytest.mark.parametrize("threads", [1, 2])
def test_int8_quantization_equals_torch_quantize_dynamic(tiny_pair, monkeypatch, threads):
    """precision.quantize_int8 converts the layers on several threads; the result must be exactly what
    torch.ao.quantization.quantize_dynamic gives (so cached replay tables of the int8 assistant stay valid)."""
    import copy
    import warnings

    import torch

    from disco.models import precision

    monkeypatch.setattr(precision.torch, "get_num_threads", lambda: threads)
    ours = precision.quantize_int8(tiny_pair.assistant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.ao.quantization.quantize_dynamic(copy.deepcopy(tiny_pair.assistant).float().eval(),
                                                        {torch.nn.Linear}, dtype=torch.qint8)
    ids = torch.tensor([list(range(3, 40))])
    with torch.inference_mode():
        assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)
    assert sum(type(m).__name__ == "Linear" and "quantized" in type(m).__module__ for m in ours.modules()) == \
        sum(type(m).__name__ == "Linear" and "quantized" in type(m).__module__ for m in theirs.modules()) > 0
