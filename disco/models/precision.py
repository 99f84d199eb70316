"""Assistant precision: the assistant's weights as the pair's dtype (``model``) or as dynamic int8 (``int8``).

Why only the assistant: the target verifies every drafted token, so whatever the assistant computes, greedy output
stays exactly the target's own and sampling keeps the target's distribution. A cheaper draft only changes how many
drafts are accepted and what each costs. On a CPU an assistant step costs ~0.4 of a target step in bf16; dynamic
int8 Linear layers halve that (../shared/CPU.md). Quantizing the *target* is not offered: dynamic int8 computes
activation scales over the whole verify batch, so a verification pass no longer equals the autoregressive passes
and every speculative lane leaves its own baseline (measured, see docs/app.md).

``torch.ao.quantization.quantize_dynamic`` is deprecated in favour of torchao; this module is the one place that
calls it, so it can be replaced without touching the engine.
"""

from __future__ import annotations

import copy
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

from disco.errors import UserError

MODEL = "model"   # the pair's own weights (bf16 / fp32 on torch, the GGUF as shipped on llama.cpp)
INT8 = "int8"     # torch: dynamic int8 nn.Linear weights, fp32 activations (CPU only)
Q4_0 = "q4_0"     # llama.cpp: the assistant GGUF re-quantized to Q4_0 by llama.cpp's quantizer
AUTO = "auto"     # the cheaper one where the calibration shows it faster on this machine, else model
BY_ENGINE = {"torch": (MODEL, INT8), "llamacpp": (MODEL, Q4_0)}
PRECISIONS = (MODEL, INT8)  # the torch engine's
ALL = (MODEL, INT8, Q4_0)   # what a lane's ``@`` suffix may name (the pair checks its engine has it)
CHOICES = (AUTO, MODEL, INT8, Q4_0)
NONE = "none"     # recorded for lanes that use no assistant (autoregressive)


class PrecisionError(UserError, ValueError):
    """An assistant precision that is unknown or not available on this device (a one-line user error)."""


def check(precision: str, device: torch.device | None = None, allow_auto: bool = False, engine: str = "torch") -> str:
    """Validate a precision name (and that it can run on ``device`` with ``engine``); return it normalised."""
    name = (precision or "").strip().lower()
    own = BY_ENGINE.get(engine, PRECISIONS)
    allowed = ((AUTO,) if allow_auto else ()) + own
    if name in ALL and name not in own:
        raise PrecisionError(f"the {name} assistant belongs to the {'llama.cpp' if name == Q4_0 else 'torch'} engine; "
                             f"this pair runs on {'llama.cpp' if engine == 'llamacpp' else 'torch'}, which offers "
                             f"{', '.join(own)}")
    if name not in allowed:
        raise PrecisionError(f"unknown assistant precision {precision!r}: use {', '.join(allowed)}")
    if name == INT8 and device is not None and device.type != "cpu":
        raise PrecisionError("the int8 assistant runs on a CPU only (dynamic int8 kernels); use 'model' on "
                             f"{device.type}")
    return name


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A dynamic-int8 copy of ``model``: every nn.Linear (the LM head included) gets int8 weights with per-tensor
    scales; activations, embeddings and norms stay in fp32. The original model is left untouched."""
    work = copy.deepcopy(model).float().eval()
    # What quantize_dynamic(work, {nn.Linear}, dtype=qint8) does (default dynamic qconfig, Linear.from_float per
    # layer; identical logits, tested), with the layers converted on every core: 4.0 s instead of 8.5 s for the
    # embedded assistant on 2 cores, most of an app start-up.
    qconfig = torch.ao.quantization.default_dynamic_qconfig
    layers = [(parent, name, child) for parent in work.modules() for name, child in parent.named_children()
              if type(child) is torch.nn.Linear]

    def convert(item):
        parent, name, child = item
        child.qconfig = qconfig
        return parent, name, torch.ao.nn.quantized.dynamic.Linear.from_float(child)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice, once per process is noise
        with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
            for parent, name, quantized_layer in pool.map(convert, layers):
                setattr(parent, name, quantized_layer)
    quantized = work.eval()
    quantized._disco_precision = INT8
    return quantized
