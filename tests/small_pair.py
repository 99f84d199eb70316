"""A very small pair over raw ids for the statistics tests (``make_small_pair``), importable by any test module
(``conftest`` is ambiguous once the browser tests' own conftest is collected)."""

from __future__ import annotations

import torch


class IdTokenizer:
    """A stand-in tokenizer for pairs that work on raw ids (the statistics tests)."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)

    def __len__(self):
        return self.vocab


def make_small_pair(vocab: int = 4, seed: int = 0, sharpness: float = 0.5, noise: float = 0.5):
    """A target and a perturbed copy of it as the assistant, over a tiny vocabulary.

    Their distributions differ clearly but overlap, so drafts are accepted about half the time and
    the rejection rule is exercised on every path. No token is EOS.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from disco.models import ModelPair
    from disco.models.tiny import perturb_

    def model(s: int):
        torch.manual_seed(s)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        m = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            m.lm_head.weight.mul_(sharpness / m.lm_head.weight.std())
        return m

    state = torch.random.get_rng_state()
    try:
        target = model(seed)
        assistant = model(seed)
        perturb_(assistant, noise, seed + 100)
    finally:
        torch.random.set_rng_state(state)
    return ModelPair("small", target, assistant, IdTokenizer(vocab), "small-target", "small-assistant",
                     torch.float32, torch.device("cpu"), 64, (vocab + 1000,))
