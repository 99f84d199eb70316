"""A loaded model pair (batch size 1) and the one way every caller runs its models: a ``TorchSession``.

A session is one sequence's KV cache on one model: ``forward(tokens, keep)`` feeds tokens on top of what it holds
and returns the last ``keep`` rows of logits in float32, ``crop(n)`` rolls it back to ``n`` tokens. The live
decoder, replay's chain builder and every timed measurement go through it, so Stop, device synchronisation and
cache cropping are written once.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field

import torch

from disco.errors import InputError, Interrupted, UserError
from disco.models import precision as prec
from disco.models.background import in_pass, with_shutdown


class ModelLoadError(UserError, RuntimeError):
    """A pair that cannot be loaded or used together (a user-facing, one-line message)."""


# Stop inside a forward pass: a pre-hook on every transformer layer polls the interrupt of the pass running in
# this thread (none outside session passes, so other users of the same model never see it). A CPU verify pass
# can take seconds; with the hooks Stop waits for one layer. Cost: measured 0.36 us per layer call,
# ~10 us on a 290 ms pass of the embedded target.
_PASS = threading.local()


def _interrupt_hook(module, args) -> None:
    interrupt = getattr(_PASS, "interrupt", None)
    if interrupt is not None and interrupt():
        raise Interrupted("stopped inside a forward pass")


def install_interrupt_hooks(model) -> int:
    """Hook the model's stack of transformer layers (the ModuleList as long as ``num_hidden_layers``) once;
    return how many layers are hooked (0 for an unusual architecture: Stop then waits for the whole pass)."""
    hooked = getattr(model, "_disco_interrupt_layers", None)
    if hooked is not None:
        return hooked
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    hooked = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and n_layers and len(module) == n_layers:
            for layer in module:
                layer.register_forward_pre_hook(_interrupt_hook)
            hooked = len(module)
            break
    model._disco_interrupt_layers = hooked
    return hooked


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so the clock reads finished work only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TorchSession:
    """One sequence's KV cache on one transformers model (see the module doc)."""

    def __init__(self, model, device: torch.device):
        from transformers import DynamicCache

        self.model = model
        self.device = device
        self.cache = DynamicCache(config=model.config)
        install_interrupt_hooks(model)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def forward(self, tokens: list[int], keep: int = 1, interrupt=None) -> tuple[torch.Tensor, float]:
        """Feed ``tokens``; return (the last ``keep`` logits rows in float32, the pass's ms). ``interrupt`` is polled
        once before the pass and by every layer during it (raises ``Interrupted``; the cache may then hold part
        of the pass)."""
        x = torch.tensor([tokens], dtype=torch.long, device=self.device)
        interrupt = with_shutdown(interrupt)  # the process's exit stops a pass too (disco.models.background)
        _PASS.interrupt = interrupt
        try:
            if interrupt():  # and once before it (unhooked models too)
                raise Interrupted("stopped before a forward pass")
            sync(self.device)
            start = time.perf_counter()
            with in_pass():  # the process's exit waits for it (disco.models.background)
                out = self.model(input_ids=x, cache=self.cache, use_cache=True, logits_to_keep=keep)
        finally:
            _PASS.interrupt = None
        logits = out.logits[0, -keep:].float()
        sync(self.device)
        return logits, (time.perf_counter() - start) * 1000.0

    def crop(self, length: int) -> None:
        """Roll the cache back to its first ``length`` tokens (transformers 5 crops by a negative count)."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)

    def close(self) -> None:
        """Drop the KV cache now, not when the session is collected (the session protocol's ``close``; a llama.cpp
        session gives its context back). The session cannot be used afterwards."""
        self.cache = None


class Tokenized:
    """What every pair does with its tokenizer (a transformers tokenizer, whichever engine runs the models)."""

    tokenizer: object
    target_id: str

    def encode(self, prompt: str, chat: bool) -> list[int]:
        """Token ids of a prompt, through the target's chat template when ``chat``."""
        if chat:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of a chat (``[{"role": "user" | "assistant", "content": ...}, ...]``, ending with the user's turn)
        through the target's chat template, ready for the assistant's reply."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ModelLoadError(f"{self.target_id} has no chat template; run without --chat")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def text_tokens(self, text: str) -> list[int]:
        """``text``'s own tokens, no special tokens (to cut a long prompt where it says nothing of the template)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """The text of one token as it appears in the output (special tokens shown by name)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


@dataclass
class ModelPair(Tokenized):
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
    assistant_precision: str = "model"  # which assistant this view drafts with (disco.models.precision)
    calibration: object = field(default=None, repr=False)  # the disco.models.numerics.Calibration that chose the dtype
    # shared by every view of one loaded pair: the assistant variants, and which models are warm
    _shared: dict = field(default_factory=lambda: {"views": {}, "warm": set(), "lock": threading.Lock()}, repr=False)

    @property
    def dtype_name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(self.dtype, str(self.dtype))

    @property
    def device_name(self) -> str:
        return str(self.device)

    engine = "torch"  # what runs the models (disco.models.llama: "llamacpp")

    def describe(self) -> dict:
        return {"models": self.name, "target": self.target_id, "assistant": self.assistant_id,
                "dtype": self.dtype_name, "device": self.device_name, "assistant_precision": self.assistant_precision,
                "engine": self.engine}

    def with_assistant(self, precision: str) -> "ModelPair":
        """This pair with the assistant in ``precision`` (``model`` or ``int8``): a view sharing the target and
        tokenizer. The int8 variant is quantized once, on first use, and kept for every later view."""
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

    def session(self, role: str) -> "TorchSession":
        """A fresh KV-cached sequence on the ``target`` or the ``assistant`` (what every caller of a model uses)."""
        return TorchSession(self.target if role == "target" else self.assistant, self.device)

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


def encode_prompt(pair, prompt: str, chat: bool, max_new_tokens: int) -> list[int]:
    """Validate and tokenize a prompt; every user mistake becomes an InputError with one clear line."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError("the prompt is empty")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
    ids = pair.encode(prompt, chat)
    if not ids:
        raise InputError("the prompt encodes to zero tokens")
    if len(ids) >= pair.context_length:
        raise InputError(f"the prompt is {len(ids)} tokens, longer than the models' context of {pair.context_length}")
    if len(ids) + max_new_tokens > pair.context_length:
        raise InputError(
            f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the models' context of "
            f"{pair.context_length}; lower max_new_tokens to at most {pair.context_length - len(ids)}"
        )
    return ids


def prefill_boundary(session, n: int) -> None:
    """Let a llama.cpp session's first pass prefill its first ``n`` tokens on a repacked twin, where fast prefill is
    on (``disco.models.llama``); every session of one prompt is given the same ``n`` (the prompt's length less one).
    Other sessions ignore it."""
    if hasattr(session, "twin_upto"):
        session.twin_upto = n


def pair_key(pair, *extra) -> str:
    """A short key naming everything about a pair that changes what its models compute (the cache files of
    tables and costs are named by it), plus ``extra`` (e.g. a prompt's token ids)."""
    import hashlib
    import json

    info = dict(pair.describe())
    # the assistant's precision changes its chains (an int8 and a bf16 assistant draft differently); so does the
    # engine (torch keys stay as they were before there was a second one, so their caches stay valid)
    engine = [] if info.get("engine", "torch") == "torch" else [info["engine"], info.get("exact")]
    engine += ["fast-prefill"] if info.get("fast_prefill") else []  # a cache of its own (keys without it unchanged)
    # the CPU variant of llama.cpp's kernels: each computes its own rows (a build without variants keeps its keys)
    engine += [f"kernels={info['cpu_variant']}"] if info.get("cpu_variant") else []
    blob = json.dumps([info.get("models"), info.get("target"), info.get("assistant"), info.get("dtype"),
                       info.get("device"), info.get("assistant_precision", "model"), *engine, *extra],
                      separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()[:16]
