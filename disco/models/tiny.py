"""The ``tiny`` preset: two small randomly initialised models and a character tokenizer, built in code (no
download), for tests and instant demos. The assistant is derived from the target so it agrees often but not always.
"""

from __future__ import annotations

import string

import torch


TINY_SPECIALS = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_tokenizer():
    """A character-level tokenizer (printable ASCII + newline + specials), built in code."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    tok.model_max_length = 1024
    return tok


def build_tiny_models(vocab_size: int, seed: int = 0, context: int = 1024):
    """Target: 6 layers. Assistant: its first 2 layers (+ a little noise), so it is cheaper and agrees
    with the target on roughly 70% of tokens, more often when it is confident.

    Random transformers are nearly uniform; scaling the LM head makes them confident enough for the
    threshold to matter, and damping the target's last layers makes the truncated copy a fair guesser.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    def config(layers: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=1, pad_token_id=0,
        )

    keep, late_scale, head_scale, noise = 2, 0.2, 30.0, 0.05
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        target = LlamaForCausalLM(config(6)).eval()
        with torch.no_grad():
            target.lm_head.weight.mul_(head_scale)
            for layer in target.model.layers[keep:]:
                layer.self_attn.o_proj.weight.mul_(late_scale)
                layer.mlp.down_proj.weight.mul_(late_scale)
        assistant = LlamaForCausalLM(config(keep)).eval()
        weights = {k: v for k, v in target.state_dict().items()
                   if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= keep)}
        assistant.load_state_dict(weights)
        perturb_(assistant, noise, seed + 1)
    finally:
        torch.random.set_rng_state(state)
    return target, assistant


def perturb_(model: torch.nn.Module, scale: float, seed: int) -> None:
    """Add seeded Gaussian noise to every weight, relative to that weight's own spread (in place)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp_min(1e-3))
