"""What a decoder-only transformer's pass costs depend on: its shape (layers, hidden size, heads, KV heads, MLP width,
vocabulary), read from a transformers config or a GGUF's metadata, and the embedded pair's two shapes. The roofline
(``disco.costs.roofline``) prices passes from these; the weight format is a setting there, never read from a file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from disco.costs.errors import CostProfileError
from disco.errors import first_line


@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer's pass costs depend on (Qwen2/Llama layout, SwiGLU MLP, grouped KV heads)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = True

    @classmethod
    def from_hf_config(cls, config: Mapping) -> "ModelShape":
        """From a transformers config dict (``config.json`` of a Qwen2/Llama-style model)."""
        try:
            heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
            return cls(int(config["num_hidden_layers"]), hidden, int(config["intermediate_size"]), heads,
                       int(config.get("num_key_value_heads") or heads), int(config.get("head_dim") or hidden // heads),
                       int(config["vocab_size"]), bool(config.get("tie_word_embeddings", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise CostProfileError(f"model config lacks or garbles a shape field ({first_line(exc)})") from None

    @property
    def params(self) -> int:
        """Weights (embedding counted once when tied; norms and biases left out)."""
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
        head = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * (attn + 3 * self.hidden * self.intermediate) + head


TARGET_SHAPE = ModelShape(28, 1536, 8960, 12, 2, 128, 151936, True)  # Qwen2.5-Coder-1.5B-Instruct
ASSISTANT_SHAPE = ModelShape(24, 896, 4864, 14, 2, 64, 151936, True)  # Qwen2.5-Coder-0.5B-Instruct


def _gguf_value(reader, key: str):
    found = reader.fields.get(key)
    if found is None:
        return None
    part = found.parts[found.data[0]]
    return bytes(part).decode("utf-8") if found.types and found.types[0].name == "STRING" else part[0]


def shape_from_gguf(path) -> ModelShape:
    """A GGUF's shape from its metadata (``ARCH.block_count``, ``ARCH.embedding_length``, ...); the vocabulary is the
    token list's length. The file's weight format is not read: on a roofline it is a setting."""
    try:
        import gguf
    except ImportError:
        raise CostProfileError("reading a GGUF's shape needs the gguf package") from None
    try:
        reader = gguf.GGUFReader(str(path))
        arch = _gguf_value(reader, "general.architecture")
        get = lambda key: _gguf_value(reader, f"{arch}.{key}")  # noqa: E731
        heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else int(get("vocab_size"))
        tied = not any(t.name == "output.weight" for t in reader.tensors)
        kv_heads = int(get("attention.head_count_kv") or heads)
        head_dim = int(get("attention.key_length") or hidden // heads)
        return ModelShape(int(get("block_count")), hidden, int(get("feed_forward_length")), heads, kv_heads, head_dim,
                          vocab, tied)
    except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise CostProfileError(f"{path}: no model shape in this GGUF ({first_line(exc)})") from None
