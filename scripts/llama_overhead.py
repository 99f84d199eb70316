"""Where the llama.cpp engine's target-alone time goes: our autoregressive lane (the engine with its per-token work:
the logits copy, torch, softmax, features) against the same decode loop with nothing but ``llama_decode`` and an
argmax on llama.cpp's own logits buffer. Interleaved, three rounds; quiet machine please.

    PYTHONPATH=. .venv/bin/python scripts/llama_overhead.py [TOKENS]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.models import encode_prompt, load_pair
from disco.policies import Autoregressive

PROMPT = "Write a Python function that checks whether a string is a palindrome."


def ours(pair, ids, n: int) -> tuple[float, float]:
    """Tokens per second of decode (the prefill iteration left out) and the forward passes' share of that time."""
    d = Decoder(pair, ids, Autoregressive(), DecodeSettings(max_new_tokens=n))
    d.step()
    start, forward_ms = time.perf_counter(), 0.0
    while not d.done:
        forward_ms += d.step().forward_ms
    seconds = time.perf_counter() - start
    return (len(d.output_ids) - 1) / seconds, forward_ms / 1000 / seconds


def bare(pair, ids, n: int) -> float:
    session = pair.session("target")
    lib, ctx, batch = session.lib, session.ctx, session._batch
    logits, _ = session.forward(ids, 1)
    token = int(logits[0].argmax())
    start = time.perf_counter()
    for _ in range(n - 1):
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = token, session.length, 1, 0, 1
        batch.n_tokens = 1
        if lib.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        session.length += 1
        token = int(np.ctypeslib.as_array(lib.llama_get_logits(ctx), shape=(1, session.model.n_vocab))[0].argmax())
    seconds = time.perf_counter() - start
    session.close()
    return (n - 1) / seconds


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    pair = load_pair("embedded", engine="llamacpp", progress=False, log=lambda *_: None)
    pair.warmup()
    ids = encode_prompt(pair, PROMPT, True, n)
    for _ in range(3):
        a, share = ours(pair, ids, n)
        b = bare(pair, ids, n)
        print(f"ours {a:.2f} tokens/s (forward passes {100 * share:.1f} % of it) | bare loop {b:.2f} tokens/s | "
              f"ours / bare in time {b / a:.3f}", flush=True)


if __name__ == "__main__":
    main()
