"""The llama.cpp engine's invariants on a tiny GGUF pair the tests write themselves (``tests/tiny_gguf.py``): its
logits are the torch engine's on the same weights, a verified row is the one-token row bit for bit (exact mode),
greedy is lossless for every policy, rollback after partial acceptance, Stop mid-pass, live = replay, the Q4_0
assistant, and speculative sampling keeps the target's distribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from disco.models import llama

if llama.available() is not None:
    pytest.skip(f"llama-cpp-python is not installed: {llama.available()}", allow_module_level=True)

import tiny_gguf  # noqa: E402  (tests/ is on the path: pytest's rootdir conftest)
from disco.costs.model import CostModel  # noqa: E402
from disco.decode.live import Decoder  # noqa: E402
from disco.decode.race import greedy_reference, run_all  # noqa: E402
from disco.decode.settings import DecodeSettings  # noqa: E402
from disco.errors import Interrupted  # noqa: E402
from disco.models import encode_prompt, gguf_pair  # noqa: E402
from disco.policies import parse_strategy  # noqa: E402
from disco.replay.run import replay_many  # noqa: E402
from disco.replay.tables import build_table  # noqa: E402

STRATEGIES = [
    "autoregressive", "static:1", "static:3", "static:8", "heuristic:2", "threshold:0.4:20", "threshold:0.0:6",
    "threshold:0.9:3", "oracle", "oracle:3", "adaptive:0.4:8", "entropy:0.5:8", "cumulative:0.5:8", "costaware:8",
    "disco:6", "pmin:0.4:8", "pmin:0.2:6:2", "lookup:4", "copy:16", "suffix", "sglang", "bandit:6", "ngram:1:4",
    "hybrid:lookup:4+static:3", "hybrid:ngram:1:4+pmin:0.4:8", "hybrid:copy:16:2+costaware:8",
]
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "x", "{'a': 1, 'b': [2, 3]}"]
COSTS = CostModel(target=[(1, 100.0), (2, 104.0), (4, 112.0), (40, 300.0)], assistant=[(1, 8.0), (40, 30.0)])


@pytest.fixture(scope="module")
def gguf_tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf")
    target, assistant = tiny_gguf.write_pair(folder)
    pair = gguf_pair.load("tiny-gguf", target, assistant)  # the tokenizer is the one written into the target GGUF
    pair.warmup()
    return pair


def test_the_tokenizer_read_from_the_gguf_is_the_tiny_pairs(gguf_tiny, tiny_pair):
    assert gguf_tiny.eos_ids == tiny_pair.eos_ids
    for prompt in PROMPTS:
        for chat in (False, True):
            assert gguf_tiny.encode(prompt, chat) == tiny_pair.encode(prompt, chat)
    assert gguf_tiny.describe()["engine"] == "llamacpp" and gguf_tiny.exact


def test_logits_are_the_torch_engines_on_the_same_weights(gguf_tiny, tiny_pair):
    ids = encode_prompt(gguf_tiny, "def fibonacci(n):", False, 8)
    for role in ("target", "assistant"):
        ours, _ = gguf_tiny.session(role).forward(ids, len(ids))
        theirs, _ = tiny_pair.session(role).forward(ids, len(ids))
        assert torch.allclose(ours, theirs, atol=1e-2), role
        assert (ours.argmax(-1) == theirs.argmax(-1)).all(), role


@pytest.mark.parametrize("k", [2, 3, 4, 5, 8, 16])
def test_a_verified_row_is_the_one_token_row_bit_for_bit(gguf_tiny, k):
    """Exact mode: whatever the batch size, every row (and every later row computed from the cache a batch wrote)
    equals what one-token passes compute."""
    assert gguf_tiny.exact
    ids = encode_prompt(gguf_tiny, "Once upon a time, in a land far away,", False, 24)
    follow = [(7 * i + 3) % 90 + 5 for i in range(16)]
    for role in ("target", "assistant"):
        single = gguf_tiny.session(role)
        single.forward(ids, 1)
        rows = torch.cat([single.forward([t], 1)[0] for t in follow] + [single.forward([2], 1)[0]])
        batched = gguf_tiny.session(role)
        batched.forward(ids, 1)
        chunks = [batched.forward(follow[i:i + k], len(follow[i:i + k]))[0] for i in range(0, len(follow), k)]
        chunks.append(batched.forward([2], 1)[0])
        assert torch.equal(torch.cat(chunks), rows), (role, k)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("chat", [False, True])
def test_every_strategy_is_lossless_in_greedy_mode(gguf_tiny, prompt, chat):
    final = run_all(gguf_tiny, prompt, STRATEGIES, DecodeSettings(max_new_tokens=32), chat=chat)
    base = final.decoders[0].output_ids
    assert len(base) > 0
    for d in final.decoders[1:]:
        assert d.output_ids == base, f"{d.strategy} diverged from autoregressive on {prompt!r}"
    summaries = final.summaries()
    assert all(s["identical_to_autoregressive"] for s in summaries)
    assert {s["engine"] for s in summaries} == {"llamacpp"}


def test_rollback_after_partial_acceptance_matches_a_fresh_prefill(gguf_tiny):
    rejections = 0
    for prompt in PROMPTS[:3]:
        ids = encode_prompt(gguf_tiny, prompt, False, 32)
        d = Decoder(gguf_tiny, ids, parse_strategy("static:6"), DecodeSettings(max_new_tokens=32))
        while not d.done:
            r = d.step()
            if d.done:
                break
            rejections += r.accepted < r.lookahead
            assert d.target.length == d.t_len and d.assistant.length == d.a_len
            for role, session, held in (("target", d.target, d.t_len), ("assistant", d.assistant, d.a_len)):
                fresh, _ = gguf_tiny.session(role).forward(d.ids, 1)
                probe = gguf_tiny.session(role)
                probe.forward(d.ids[:held], 1)
                cached, _ = probe.forward(d.ids[held:], 1)
                assert torch.equal(cached, fresh), role
    assert rejections > 0


class _StopAfter:
    def __init__(self, n: int):
        self.n, self.polls = n, 0

    def __call__(self) -> bool:
        self.polls += 1
        return self.polls >= self.n


@pytest.mark.parametrize("poll", [1, 2, 40])  # before the first pass, inside it (llama.cpp polls per graph node)
def test_stop_abandons_the_iteration_mid_pass(gguf_tiny, poll):
    ids = encode_prompt(gguf_tiny, "Once upon a time", False, 32)
    d = Decoder(gguf_tiny, ids, parse_strategy("static:4"), DecodeSettings(max_new_tokens=32))
    d.step()
    records, tokens, out = list(d.records), list(d.tokens), list(d.output_ids)
    interrupt = _StopAfter(poll)
    with pytest.raises(Interrupted):
        d.step(interrupt)
    assert interrupt.polls == poll  # polled until it fired, never after
    assert d.records == records and d.tokens == tokens and d.output_ids == out
    with pytest.raises(RuntimeError, match="interrupted"):
        d.step()
    after = run_all(gguf_tiny, "Once upon a time", ["autoregressive", "static:4"], DecodeSettings(max_new_tokens=12))
    assert after.decoders[0].output_ids == after.decoders[1].output_ids


def test_finished_and_stopped_decoders_give_their_contexts_back_at_once(gguf_tiny):
    """A decoder and its iteration core refer to each other, so only a full garbage collection would free them: a
    finished (or interrupted) decoder hands its sessions back itself, and a run of many lanes reuses two contexts
    per model instead of making new ones (a 576-run sampling study had reached 9.5 GB)."""
    import gc

    ids = encode_prompt(gguf_tiny, "def fibonacci(n):", False, 12)
    models = (gguf_tiny.target_model, gguf_tiny.assistant_model)
    Decoder(gguf_tiny, ids, parse_strategy("static:3"), DecodeSettings(max_new_tokens=12)).run()  # the pool is warm
    before = [m.contexts_made for m in models]
    gc.disable()
    try:
        kept = [Decoder(gguf_tiny, ids, parse_strategy("static:3"), DecodeSettings(max_new_tokens=12)).run()
                for _ in range(8)]  # still referenced: nothing would free them
        stopped = Decoder(gguf_tiny, ids, parse_strategy("static:3"), DecodeSettings(max_new_tokens=12))
        with pytest.raises(Interrupted):
            stopped.step(lambda: True)
        kept.append(stopped)
        assert [m.contexts_made for m in models] == before
        assert all(d.output_ids == kept[0].output_ids for d in kept[:8])  # the text is kept
    finally:
        gc.enable()


def test_replay_equals_the_live_engine(gguf_tiny):
    fields = ("iteration", "lookahead", "accepted", "emitted", "stop_reason", "draft_calls", "target_tokens")
    for prompt in PROMPTS[:2]:
        ids = encode_prompt(gguf_tiny, prompt, False, 24)
        table = build_table(gguf_tiny, ids, 24)
        assert table.meta["engine"] == "llamacpp"
        results = replay_many(table, [parse_strategy(s) for s in STRATEGIES], 24, COSTS)
        for spec in STRATEGIES:
            policy = parse_strategy(spec)
            if policy.probes_verification:
                policy.reference = greedy_reference(gguf_tiny, ids, 24)
            live = Decoder(gguf_tiny, ids, policy, DecodeSettings(max_new_tokens=24), costs=COSTS).run()
            assert [tuple(getattr(r, f) for f in fields) for r in results[spec].records] == \
                   [tuple(getattr(r, f) for f in fields) for r in live.records], spec
            assert results[spec].output_ids == live.output_ids, spec


def test_the_q4_0_assistant_is_requantized_once_and_stays_lossless(gguf_tiny):
    q4 = gguf_tiny.with_assistant("q4_0")
    assert q4.assistant_precision == "q4_0" and q4.target_model is gguf_tiny.target_model
    assert q4.assistant_model.path.endswith(".gguf") and "q4_0" in q4.assistant_model.path
    assert gguf_tiny.with_assistant("q4_0") is q4  # one view, one quantization
    final = run_all(gguf_tiny, "def fibonacci(n):", ["autoregressive", "static:3@q4_0", "threshold:0.4:8@model"],
                    DecodeSettings(max_new_tokens=24))
    base = final.decoders[0].output_ids
    assert all(d.output_ids == base for d in final.decoders)
    assert [d.pair.assistant_precision for d in final.decoders[1:]] == ["q4_0", "model"]
    with pytest.raises(Exception, match="torch engine"):
        gguf_tiny.with_assistant("int8")


# -- sampling: the Leviathan rule on this engine keeps the target's distribution --------------------------------

PROMPT = [1, 2, 3]
NEW = 3
SAMPLES = 2000


@pytest.fixture(scope="module")
def gguf_small(tmp_path_factory):
    from small_pair import IdTokenizer, make_small_pair

    small = make_small_pair()
    folder = tmp_path_factory.mktemp("small-gguf")
    target = tiny_gguf.write(small.target, folder / "target.gguf", vocab=False)
    assistant = tiny_gguf.write(small.assistant, folder / "assistant.gguf", vocab=False)
    return gguf_pair.load("small-gguf", target, assistant, tokenizer=IdTokenizer(4), eos_ids=(1004,))


def test_speculative_sampling_keeps_the_target_distribution(gguf_small):
    from test_sampling import p_value

    from disco.decode.sampling import distribution

    settings = DecodeSettings(max_new_tokens=NEW, sample=True)
    probs = {}
    for seq in itertools.product(range(4), repeat=NEW):  # the target's own distribution, by enumeration
        logits, _ = gguf_small.session("target").forward(PROMPT + list(seq), len(PROMPT) + NEW)
        dist = distribution(logits[len(PROMPT) - 1: len(PROMPT) - 1 + NEW], settings)
        probs[seq] = float(np.prod([dist[i, t].item() for i, t in enumerate(seq)]))
    counts, drafted, accepted = {}, 0, 0
    for seed in range(SAMPLES):
        d = Decoder(gguf_small, PROMPT, parse_strategy("static:2"),
                    DecodeSettings(max_new_tokens=NEW, sample=True, seed=seed)).run()
        counts[tuple(d.output_ids)] = counts.get(tuple(d.output_ids), 0) + 1
        drafted += sum(r.lookahead for r in d.records)
        accepted += sum(r.accepted for r in d.records)
    assert 0.2 < accepted / drafted < 0.9  # the rejection path is exercised
    assert p_value(counts, probs) > 1e-3


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_the_command_line_runs_a_gguf_pair_on_llama_cpp(gguf_tiny, tmp_path):
    import subprocess
    import sys

    import pandas as pd

    spec = f"{gguf_tiny.target_path}::{gguf_tiny.assistant_path}"
    out = tmp_path / "trace.csv"
    proc = subprocess.run([sys.executable, "-m", "disco", "generate", "--models", spec, "--prompt", "def f(x):",
                           "--max-new-tokens", "12", "--strategy", "autoregressive", "--strategy", "pmin:0.3:4",
                           "--strategy", "static:3@q4_0", "--csv", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    trace = pd.read_csv(out)
    assert set(trace["engine"]) == {"llamacpp"} and set(trace["exact"]) == {True}
    assert "yes" in proc.stdout and "MISMATCH" not in proc.stdout
    for argv, needle in ((["--engine", "torch"], "llama.cpp engine"), (["--assistant-precision", "int8"], "torch engine"),
                         (["--dtype", "bf16", "--engine", "llamacpp"], "--dtype bf16")):
        bad = subprocess.run([sys.executable, "-m", "disco", "generate", "--models", spec, "--prompt", "x", *argv],
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and needle in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.fixture(scope="module")
def gguf_fast_prefill(tmp_path_factory):
    """The tiny pair with exact decoding and its prefills on a repacked twin (DISCO_LLAMA_FAST_PREFILL=1)."""
    folder = tmp_path_factory.mktemp("tiny-gguf-fast")
    target, assistant = tiny_gguf.write_pair(folder)
    mp = pytest.MonkeyPatch()
    mp.setenv(llama.FAST_PREFILL_ENV, "1")
    try:
        pair = gguf_pair.load("tiny-gguf", target, assistant)
    finally:
        mp.undo()
    pair.warmup()
    return pair


def test_fast_prefill_hands_over_the_cache_and_decoding_stays_exact(gguf_fast_prefill, gguf_tiny):
    from disco.models.pair import prefill_boundary

    pair = gguf_fast_prefill
    assert pair.target_model.fast_prefill and pair.describe()["fast_prefill"]
    ids = encode_prompt(pair, "def fibonacci(n):\n    if n < 2:\n        return n", False, 16)
    assert len(ids) - 1 >= llama.FAST_PREFILL_MIN
    s = pair.session("target")
    prefill_boundary(s, len(ids) - 1)
    twin_prefills = []
    on_twin = s._prefill_on_twin
    s._prefill_on_twin = lambda prefix, interrupt: (twin_prefills.append(len(prefix)), on_twin(prefix, interrupt))
    first, _ = s.forward(ids, 1)
    assert twin_prefills == [len(ids) - 1] and s.length == len(ids)  # prefilled on the twin, then handed over
    # the handed-over cache is the prompt's: the next row matches an exact prefill's (the tiny GGUF's f32 weights are
    # not repacked, so the twin computes what the exact model does; a lost or garbled cache would not)
    plain = gguf_tiny.session("target")
    expected, _ = plain.forward(ids, 1)
    plain.close()
    assert torch.allclose(first, expected, atol=1e-4)
    token = int(first[0].argmax())
    feed = [token, 5, 7, 11]
    rows, _ = s.forward(feed, 4)  # a verified batch ...
    s.crop(len(ids))
    for i, t in enumerate(feed):  # ... equals one-token passes on the same cache, row for row
        one, _ = s.forward([t], 1)
        assert torch.equal(one[0], rows[i])
    s.close()


@pytest.mark.parametrize("prompt", ["def fibonacci(n):\n    if n < 2:\n        return n", "The quick brown fox jumps"])
def test_every_strategy_is_lossless_after_a_fast_prefill(gguf_fast_prefill, gguf_tiny, prompt):
    final = run_all(gguf_fast_prefill, prompt, STRATEGIES, DecodeSettings(max_new_tokens=24))
    base = final.decoders[0].output_ids
    for d in final.decoders[1:]:
        assert d.output_ids == base, f"{d.strategy} diverged from autoregressive after a fast prefill"
    plain = run_all(gguf_tiny, prompt, ["autoregressive"], DecodeSettings(max_new_tokens=24))
    assert plain.decoders[0].output_ids == base  # unrepacked weights: the same text as an exact prefill


@pytest.mark.parametrize("spec", ["hybrid:lookup:4+static:3", "threshold:0.3:6", "oracle:4"])
def test_live_equals_replay_after_a_fast_prefill(gguf_fast_prefill, spec, monkeypatch):
    """The table's assistant chains and reference stop their fast prefill where the lanes do (``prefill_boundary``)."""
    pair = gguf_fast_prefill
    prefixes = []
    on_twin = llama.LlamaSession._prefill_on_twin
    monkeypatch.setattr(llama.LlamaSession, "_prefill_on_twin",
                        lambda self, prefix, interrupt: (prefixes.append(len(prefix)), on_twin(self, prefix, interrupt)))
    ids = encode_prompt(pair, "def fibonacci(n):\n    if n < 2:\n        return n", False, 24)
    table = build_table(pair, ids, 24)
    policy = parse_strategy(spec)
    if policy.kind == "oracle":
        policy.reference = greedy_reference(pair, ids, 24)
    live = Decoder(pair, ids, policy, DecodeSettings(max_new_tokens=24), costs=COSTS).run()
    replayed = replay_many(table, [parse_strategy(spec)], 24, COSTS)[spec]
    assert [(r.lookahead, r.accepted, r.drafter) for r in live.records] == \
        [(r.lookahead, r.accepted, r.drafter) for r in replayed.records]
    assert live.output_ids == replayed.output_ids
    assert prefixes and set(prefixes) == {len(ids) - 1}  # every session's twin prefill stopped at the same place


def test_fast_prefill_has_a_cache_key_of_its_own(gguf_tiny, gguf_fast_prefill):
    from disco.models.pair import pair_key

    assert pair_key(gguf_tiny) != pair_key(gguf_fast_prefill)
