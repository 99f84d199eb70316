"""Numerics chosen by measurement: which dtype and which assistant precision make speculation fastest here.

A matmul probe cannot answer this: on a CPU without native bf16 a bf16 *one-token* pass is still fast (memory
bound), while a bf16 *verification* pass over 8 tokens costs ~5x as much (compute bound, emulated), and that is
the pass speculative decoding lives on (../shared/CPU.md). So the calibration times the passes that matter, on
the real models, on top of a real cache:

  * a target pass over 1, 4 and 8 tokens, for each candidate dtype (bf16 and fp32 on a CPU);
  * one assistant step (1 token) per assistant precision (the pair's dtype, and dynamic int8);

and predicts, for each dtype, the best time per token over static lookaheads K = 0..8 with Leviathan et al.'s
expected tokens per iteration at a prior acceptance rate (``PRIOR_ALPHA``; the embedded pair measures ~0.8):

    ms/token(dtype) = min over K and assistant of  (T_dtype(K + 1) + K * A) / E[tokens | alpha, K],

with T interpolated between the measured sizes (K = 0 is plain autoregressive decoding). The dtype with the
lowest prediction wins; the int8 assistant is chosen where its step is measurably (5 %) cheaper. The result is
cached on disk, keyed by everything that changes the answer (CPU model and flags, oneDNN's ISA limit, torch
version, thread count, model pair, device), so later starts are instant; a changed key simply measures again.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from disco import cache
from disco.machine import flags_line, key_hash
from disco.models.gguf_pair import PRECISIONS as GGUF_PRECISIONS
from disco.models.keys import machine_key
from disco.models import precision as prec
from disco.models.pair import TorchSession
from disco.models.timing import interpolate, pass_costs
from disco.theory import expected_tokens

CANDIDATES_CPU = ("bf16", "fp32")
SIZES = (1, 4, 8)
PRIOR_ALPHA = 0.8
MAX_K = 8
INT8_MARGIN = 0.95     # int8 must be at least 5 % cheaper per step to be chosen
CONTEXT_TOKENS = 40
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def cache_dir(root: str | Path | None = None) -> Path:
    """Where decisions are cached: ``root``, or the one cache's machine folder."""
    return Path(root).expanduser() if root is not None else cache.machine_dir()


# ---------------------------------------------------------------------------------------------
# measuring


def context_ids(pair, n: int = CONTEXT_TOKENS) -> list[int]:
    text = ("def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n"
            "        mid = (lo + hi) // 2\n")
    ids = list(pair.tokenizer(text, add_special_tokens=False)["input_ids"]) or [pair.eos_ids[0]]
    return (ids * (n // len(ids) + 1))[:n]


def best_ms_per_token(target: dict[int, float], assistant_ms: float, alpha: float = PRIOR_ALPHA,
                      max_k: int = MAX_K) -> tuple[float, int]:
    """(predicted ms per token, K) of the best static lookahead K in 0..max_k (K = 0: autoregressive)."""
    best = (interpolate(target, 1), 0)
    for k in range(1, max_k + 1):
        ms = (interpolate(target, k + 1) + k * assistant_ms) / expected_tokens(alpha, k)
        if ms < best[0]:
            best = (ms, k)
    return best


@dataclass
class Calibration:
    key: dict
    target_ms: dict[str, dict[int, float]]          # dtype -> tokens -> ms
    assistant_ms: dict[str, float]                   # "bf16" / "fp32" (model precision in that dtype), "int8"
    predicted: dict[str, dict] = field(default_factory=dict)  # dtype -> {"ms_per_token", "k", "assistant"}
    dtype: str = "bf16"
    assistant_precision: str = prec.MODEL
    reason: str = ""
    seconds: float = 0.0
    measured_at: str = ""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["target_ms"] = {d: {str(n): ms for n, ms in v.items()} for d, v in self.target_ms.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        data = dict(data)
        data["target_ms"] = {d: {int(n): float(ms) for n, ms in v.items()} for d, v in data["target_ms"].items()}
        data["assistant_ms"] = {k: float(v) for k, v in data["assistant_ms"].items()}
        return cls(**data)

    def summary(self) -> str:
        """The decision and its numbers in one line (printed at start-up, shown in the app)."""
        parts = []
        for d, t in self.target_ms.items():
            parts.append(f"{d}: target {t[1]:.0f}/{t[4]:.0f}/{t[8]:.0f} ms for 1/4/8 tokens"
                         + (f", assistant {self.assistant_ms[d]:.0f} ms" if d in self.assistant_ms else ""))
        for name, ms in self.assistant_ms.items():
            if name not in self.target_ms:
                parts.append(f"{name} assistant {ms:.0f} ms")
        return f"chose {self.dtype} + {self.assistant_precision} assistant ({self.reason}); " + "; ".join(parts)


def decide(target_ms: dict[str, dict[int, float]], assistant_ms: dict[str, float],
           alpha: float = PRIOR_ALPHA) -> tuple[str, str, dict, str]:
    """(dtype, assistant precision, predictions, reason) from measured costs (pure: unit-testable)."""
    predicted = {}
    for d, target in target_ms.items():
        options = {prec.MODEL: assistant_ms[d]}
        if prec.INT8 in assistant_ms:
            options[prec.INT8] = assistant_ms[prec.INT8]
        best = None
        for name, a_ms in options.items():
            ms, k = best_ms_per_token(target, a_ms, alpha)
            if best is None or ms < best[0]:
                best = (ms, k, name)
        predicted[d] = {"ms_per_token": best[0], "k": best[1], "assistant": best[2],
                        "verify_8_over_1": target[8] / target[1]}
    dtype = min(predicted, key=lambda d: predicted[d]["ms_per_token"])
    int8 = assistant_ms.get(prec.INT8)
    assistant = prec.INT8 if int8 is not None and int8 < INT8_MARGIN * assistant_ms[dtype] else prec.MODEL
    p = predicted[dtype]
    others = ", ".join(f"{d} {v['ms_per_token']:.0f}" for d, v in predicted.items() if d != dtype)
    reason = (f"predicted {p['ms_per_token']:.0f} ms/token at K={p['k']} (alpha {alpha:g})"
              + (f" vs {others}" if others else "")
              + f"; verifying 8 tokens costs {p['verify_8_over_1']:.1f}x one")
    return dtype, assistant, predicted, reason


def _sessions(model, device):
    return lambda: TorchSession(model, device)


def calibrate(pair, models: str, candidates=CANDIDATES_CPU, reps: int = 3, log=None) -> Calibration:
    """Time the passes that matter for every candidate dtype and the int8 assistant; decide (see module doc).

    Other dtypes are timed on temporary copies (the embedded pair in fp32 needs ~8 GB for a few seconds).
    """
    start = time.perf_counter()
    device = pair.device
    ctx = context_ids(pair)
    target_ms: dict[str, dict[int, float]] = {}
    assistant_ms: dict[str, float] = {}
    for name in candidates:
        dt = DTYPES[name]
        # a copy in the candidate dtype (the pair itself is never touched; an fp32 -> bf16 -> fp32 trip would lose bits)
        target, assistant = (m if m.dtype == dt else copy.deepcopy(m).to(dt) for m in (pair.target, pair.assistant))
        pass_costs(_sessions(target, device), ctx, (1,), reps=1)  # warm the new kernels
        target_ms[name] = pass_costs(_sessions(target, device), ctx, SIZES, reps)
        assistant_ms[name] = pass_costs(_sessions(assistant, device), ctx, (1,), reps + 2)[1]
        del target, assistant
    if device.type == "cpu":
        int8 = pair.with_assistant(prec.INT8).assistant
        pass_costs(_sessions(int8, device), ctx, (1,), reps=1)
        assistant_ms[prec.INT8] = pass_costs(_sessions(int8, device), ctx, (1,), reps + 2)[1]
    dtype, assistant, predicted, reason = decide(target_ms, assistant_ms)
    cal = Calibration(machine_key(models, device), target_ms, assistant_ms, predicted, dtype, assistant, reason,
                      time.perf_counter() - start, time.strftime("%Y-%m-%d %H:%M:%S"))
    if log is not None:
        log(f"calibrated in {cal.seconds:.1f} s on {flags_line(cal.key)}: {cal.summary()}")
    return cal


AGREEMENT_TOKENS = 32
AGREEMENT_MARGIN = 0.03  # a cheaper assistant may agree with the target at most 3 points less often


def _agreement(pair, view, context: list[int], n: int = AGREEMENT_TOKENS) -> float:
    """How often the assistant's greedy token equals the target's along the target's own greedy continuation of
    ``context`` (first-draft acceptance, Leviathan's alpha), on ``n`` positions."""
    target = pair.session("target")
    logits, _ = target.forward(list(context), 1)
    reference = []
    for _ in range(n):
        reference.append(int(logits[-1].argmax()))
        logits, _ = target.forward([reference[-1]], 1)
    drafts, _ = view.session("assistant").forward(list(context) + reference[:-1], n)
    guesses = drafts.argmax(dim=-1).tolist()
    return sum(g == r for g, r in zip(guesses, reference)) / n


def calibrate_gguf(pair, models: str, reps: int = 3, log=None) -> Calibration:
    """The llama.cpp engine's numerics decision: the GGUF types are the model's own, so only the assistant precision
    is chosen. ``q4_0`` (re-quantized) is chosen where its step is at least 5 % cheaper and its first-draft
    agreement with the target is within ``AGREEMENT_MARGIN`` of the shipped assistant's."""
    start = time.perf_counter()
    ctx = context_ids(pair)
    target = pass_costs(lambda: pair.session("target"), ctx, SIZES, reps)
    assistant_ms, agreement = {}, {}
    for name in GGUF_PRECISIONS:
        view = pair.with_assistant(name)
        assistant_ms[name] = pass_costs(lambda: view.session("assistant"), ctx, (1,), reps + 2)[1]
        agreement[name] = _agreement(pair, view, ctx)
    cheaper = assistant_ms[prec.Q4_0] < INT8_MARGIN * assistant_ms[prec.MODEL]
    close = agreement[prec.Q4_0] >= agreement[prec.MODEL] - AGREEMENT_MARGIN
    chosen = prec.Q4_0 if cheaper and close else prec.MODEL
    reason = (f"q4_0 assistant {assistant_ms[prec.Q4_0]:.0f} ms vs {assistant_ms[prec.MODEL]:.0f} ms a step, "
              f"first-draft agreement {agreement[prec.Q4_0]:.2f} vs {agreement[prec.MODEL]:.2f}; verifying 8 tokens "
              f"costs {target[8] / target[1]:.1f}x one")
    cal = Calibration(machine_key(models, pair.device, pair.engine), {pair.dtype_name: target}, assistant_ms,
                      {"agreement": agreement}, pair.dtype_name, chosen, reason, time.perf_counter() - start,
                      time.strftime("%Y-%m-%d %H:%M:%S"))
    if log is not None:
        log(f"calibrated in {cal.seconds:.1f} s on {flags_line(cal.key)}: {cal.summary()}")
    return cal


def path_for(key: dict, root: str | Path | None = None) -> Path:
    return cache_dir(root) / f"calibration-{key_hash(key)}.json"


def load_cached(models: str, device, root: str | Path | None = None, engine: str = "torch") -> Calibration | None:
    """The cached calibration for this machine and pair, or None (missing, damaged, or made under another key)."""
    key = machine_key(models, device, engine)
    path = path_for(key, root)
    try:
        cal = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return cal if cal.key == key else None


def save(cal: Calibration, root: str | Path | None = None) -> Path | None:
    return cache.write_json(path_for(cal.key, root), cal.to_dict())
