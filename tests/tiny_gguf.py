"""A tiny GGUF pair the tests write themselves (the ``gguf`` package's writer): the tiny torch pair's random weights
(``disco.models.tiny``) as Qwen2-shaped GGUF models, so the llama.cpp engine runs in seconds and its logits can be
held against the torch engine's on the same weights.

The tiny models are Llama-shaped (RMSNorm, SwiGLU, rotary attention without biases); llama.cpp's ``qwen2``
architecture is the same graph with optional q/k/v biases and NeoX-style rotary embeddings, which is also how
transformers applies them (rotate-half), so the weights go in unpermuted. The vocabulary is the tiny pair's
character tokenizer written as a byte-level BPE without merges (GPT-2 style, as Qwen2's is), with the same ids and
the tiny chat template, so both llama.cpp and transformers read it from the file and encode exactly as the tiny
torch pair does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write(model, path: Path, quant: str = "F32", vocab: bool = True) -> Path:
    """Write one transformers Llama-shaped model as a GGUF file; matrices in ``quant`` (F32, F16 or Q8_0). Without
    ``vocab`` the file has dummy tokens (llama.cpp's "none" vocabulary): the caller brings a tokenizer."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    writer.add_vocab_size(cfg.vocab_size)
    if vocab:
        _add_vocab(writer, cfg.vocab_size)
    else:
        writer.add_tokenizer_model("none")
    kind = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
            "Q8_0": gguf.GGMLQuantizationType.Q8_0}[quant]
    writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                          "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[quant])

    def put(name: str, tensor, matrix: bool = True) -> None:
        data = tensor.detach().float().numpy().astype(np.float32)
        if matrix and kind != gguf.GGMLQuantizationType.F32:
            packed = gguf.quants.quantize(data, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)
        else:
            writer.add_tensor(name, data)

    put("token_embd.weight", model.model.embed_tokens.weight, matrix=False)
    put("output_norm.weight", model.model.norm.weight, matrix=False)
    put("output.weight", model.lm_head.weight)
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        put(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, matrix=False)
        put(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, matrix=False)
        for name, w in (("attn_q", a.q_proj), ("attn_k", a.k_proj), ("attn_v", a.v_proj), ("attn_output", a.o_proj),
                        ("ffn_gate", m.gate_proj), ("ffn_up", m.up_proj), ("ffn_down", m.down_proj)):
            put(f"blk.{i}.{name}.weight", w.weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def _add_vocab(writer, vocab_size: int) -> None:
    import gguf

    from disco.models.tiny import TINY_CHAT_TEMPLATE, TINY_SPECIALS, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    byte = _bytes_to_unicode()
    ids = tok.get_vocab()
    tokens = [""] * vocab_size
    types = [gguf.TokenType.NORMAL] * vocab_size
    for text, i in ids.items():
        if text in TINY_SPECIALS:
            tokens[i], types[i] = text, gguf.TokenType.CONTROL
        else:
            tokens[i] = "".join(byte[b] for b in text.encode("utf-8"))
    for i, text in enumerate(tokens):
        if not text:
            tokens[i], types[i] = f"[PAD{i}]", gguf.TokenType.UNUSED
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    # a character vocabulary needs no merges, but llama.cpp refuses a BPE vocabulary without any and the writer
    # writes no empty array: one merge ("~" + "`", in the slot of the never-emitted <unk>) that no test text holds
    tokens[ids["<unk>"]], types[ids["<unk>"]] = "~`", gguf.TokenType.NORMAL
    writer.add_token_merges(["~ `"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_eos_token_id(ids["<eos>"])
    writer.add_pad_token_id(ids["<pad>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)


def write_pair(folder: Path, quant: str = "F32") -> tuple[Path, Path]:
    """The tiny torch pair's target and assistant as ``target.gguf`` and ``assistant.gguf`` in ``folder``."""
    from disco.models.tiny import build_tiny_models, build_tiny_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target, assistant = build_tiny_models(len(build_tiny_tokenizer()))
    return write(target, folder / "target.gguf", quant), write(assistant, folder / "assistant.gguf", quant)
