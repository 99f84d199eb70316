"""``roofline:DEVICE[:FORMAT]``: what a forward pass would cost on a named accelerator we cannot time here.

The batched replay asks what a pass over B rows costs; on this CPU it can be measured, on an H100 it cannot. A
roofline (Williams, Waterman, Patterson, "Roofline: an insightful visual performance model", CACM 2009) answers from
the device's datasheet and the models' shapes: each operation of the pass (per layer the QKV projection, attention
over each row's KV cache, the output projection and the SwiGLU MLP; then the LM head writing every position's logits,
as verification needs them all) takes the longer of moving its bytes at the achieved bandwidth and doing its FLOPs at
the achieved compute rate. Small passes are bandwidth-bound, large ones compute-bound; where the crossing lies is
exactly what decides when speculation stops paying at large batches, so the model says it per operation
(``breakdown``) rather than as one curve.

A roofline is only as good as its factors, so every uncertain one is explicit: achieved fraction of the datasheet's
bandwidth and compute, the per-kernel launch cost (eager or CUDA graphs) and the host time per iteration (scheduling
and the sync that reading the accepted tokens forces). ``band`` gives the models at each factor's stated range;
``fit`` fits the factors to measured passes and ``held_out_report`` says how well a fit predicts passes it did not
see. Devices are data (``devices.json``); weight formats are a setting, shapes come from the models' configs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from disco import cache, machine
from disco.costs.errors import CostProfileError
from disco.costs.shapes import ASSISTANT_SHAPE, TARGET_SHAPE, ModelShape, shape_from_gguf  # noqa: F401
from disco.errors import first_line

DEVICES_FILE = Path(__file__).with_name("devices.json")
PREFIX = "roofline:"
KERNELS_PER_LAYER = 10  # 2 norms, QKV, rotary, attention, O, 2 residual adds, gate+up, SiLU*mul, down (~10)
KERNELS_FIXED = 4  # embedding, final norm, LM head, argmax
KV_BYTES = 2  # the KV cache in bf16
LOGIT_BYTES = 4  # fp32 logits
UNCERTAIN_FACTORS = ("bandwidth_efficiency", "compute_efficiency", "kernel_us", "host_ms")
BATCH1_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048)
FIGURES = ("memory_bandwidth_gbs", "bf16_tflops", "int8_tops", "kernel_us_eager", "kernel_us_graph",
           "host_ms_per_iteration")
RANGED = ("kernel_us_graph", "kernel_us_eager", "host_ms_per_iteration")


# ---------------------------------------------------------------------------------------------
# shapes and weight formats


@dataclass(frozen=True)
class WeightFormat:
    """Bytes per weight and which compute path multiplies them; the LM head and activations have their own."""

    weight_bytes: float
    act_bytes: float
    compute: str  # the device figure the matrix products run at
    head_bytes: float
    head_compute: str
    cpu_only: bool = False


FORMATS = {
    "bf16": WeightFormat(2.0, 2.0, "bf16_tflops", 2.0, "bf16_tflops"),
    # W8A8 as vLLM serves FP8 checkpoints: 1-byte weights and activations, the LM head left in bf16
    "fp8": WeightFormat(1.0, 1.0, "fp8_tflops", 2.0, "bf16_tflops"),
    # 4-bit weights with a bf16 scale and a 4-bit zero per group of 128 (GPTQ/AWQ layout), bf16 compute
    "w4a16": WeightFormat(0.5 + 2.5 / 128, 2.0, "bf16_tflops", 2.0, "bf16_tflops"),
    # llama.cpp Q4_K_M averages 4.85 bits a weight; its output tensor is Q6_K (6.5625 bits); fp32 activations
    "q4_k_m": WeightFormat(4.85 / 8, 4.0, "bf16_tflops", 6.5625 / 8, "bf16_tflops", cpu_only=True),
}


# ---------------------------------------------------------------------------------------------
# devices


def _bad(device: str, what: str) -> CostProfileError:
    return CostProfileError(f"devices file: device {device!r}: {what}")


def _number(device: str, name: str, value, *, none_ok=False) -> float | None:
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(device, f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _bad(device, f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _range(device: str, name: str, value, cap: float | None = None) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise _bad(device, f"{name} must be a [low, high] range, got {value!r}")
    low, high = (_number(device, name, v) for v in value)
    if low > high:
        raise _bad(device, f"{name} range [{low:g}, {high:g}] has low > high")
    if cap is not None and high > cap:
        raise _bad(device, f"{name} range [{low:g}, {high:g}] goes above {cap:g}")
    return low, high


def _check_device(device: str, entry) -> dict:
    """One device's entry, validated; ``measured`` figures replace the datasheet's in the returned ``figures``."""
    if not isinstance(entry, Mapping):
        raise _bad(device, "must be an object")
    figures = {}
    for name in FIGURES:
        if name not in entry:
            raise _bad(device, f"lacks {name}")
        figures[name] = _number(device, name, entry[name])
    figures["fp8_tflops"] = _number(device, "fp8_tflops", entry.get("fp8_tflops"), none_ok=True)
    efficiency, ranges = entry.get("efficiency") or {}, entry.get("ranges") or {}
    limits = {f"efficiency.{k}": _range(device, f"efficiency.{k}", efficiency.get(k), cap=1.0)
              for k in ("bandwidth", "compute")}
    limits.update({k: _range(device, f"ranges.{k}", ranges.get(k)) for k in RANGED})
    measured = entry.get("measured")
    if measured is not None:
        if not isinstance(measured, Mapping) or not str(measured.get("where") or "").strip():
            raise _bad(device, "measured must be null or an object saying where (a 'where' field)")
        for name, value in measured.items():
            if name in figures:
                figures[name] = _number(device, f"measured.{name}", value)
    for name in RANGED:
        low, high = limits[name]
        if not low <= figures[name] <= high:
            raise _bad(device, f"{name} {figures[name]:g} lies outside its range [{low:g}, {high:g}]")
    kind = entry.get("kind", "gpu")
    if kind not in ("gpu", "cpu"):
        raise _bad(device, f"kind must be gpu or cpu, got {kind!r}")
    return {"id": device, "name": str(entry.get("name") or device), "kind": kind, "figures": figures,
            "limits": limits, "measured": measured, "calibrated": bool(entry.get("calibrated", measured is not None)),
            "sources": str(entry.get("sources") or "")}


_LOADED: dict[str, dict] | None = None


def load_devices(path=None) -> dict[str, dict]:
    """The devices table (``devices.json`` beside this module, another file, or an already-parsed mapping),
    validated: a missing, non-numeric, non-finite or non-positive figure, or a range with low > high, is one line."""
    global _LOADED
    if path is None and _LOADED is not None:
        return _LOADED
    if isinstance(path, Mapping) and all(isinstance(v, Mapping) and "figures" in v for v in path.values()):
        return dict(path)  # already loaded
    if isinstance(path, Mapping):
        data = path
    else:
        source = Path(path) if path is not None else DEVICES_FILE
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CostProfileError(f"devices file {str(source)!r} could not be read: {first_line(exc)}") from None
    if not isinstance(data, Mapping) or not data:
        raise CostProfileError("devices file: expected an object of devices by id")
    table = {str(k).lower(): _check_device(str(k).lower(), v) for k, v in data.items()}
    if path is None:
        _LOADED = table
    return table


def _device(device, devices=None) -> dict:
    """A validated device entry from an id (looked up in ``devices``) or a raw entry (a dict with figures)."""
    if isinstance(device, Mapping):
        return device if "figures" in device else _check_device(str(device.get("name", "device")), device)
    table = load_devices(devices)
    key = str(device).strip().lower()
    if key not in table:
        raise CostProfileError(f"unknown device {device!r}: known devices are {', '.join(sorted(table))}")
    return table[key]


def nominal_factors(entry: Mapping, graphs: bool = True) -> dict[str, float]:
    """The central value of each uncertain factor: efficiencies at the middle of their ranges, the rest as stated."""
    figures, limits = entry["figures"], entry["limits"]
    return {"bandwidth_efficiency": sum(limits["efficiency.bandwidth"]) / 2,
            "compute_efficiency": sum(limits["efficiency.compute"]) / 2,
            "kernel_us": figures["kernel_us_graph" if graphs else "kernel_us_eager"],
            "host_ms": figures["host_ms_per_iteration"]}


def factor_ranges(entry: Mapping, graphs: bool = True) -> dict[str, tuple[float, float]]:
    limits = entry["limits"]
    return {"bandwidth_efficiency": limits["efficiency.bandwidth"], "compute_efficiency": limits["efficiency.compute"],
            "kernel_us": limits["kernel_us_graph" if graphs else "kernel_us_eager"],
            "host_ms": limits["host_ms_per_iteration"]}


def _format(entry: Mapping, fmt: str | None) -> str:
    name = (fmt or ("q4_k_m" if entry["kind"] == "cpu" else "bf16")).strip().lower()
    if name not in FORMATS:
        raise CostProfileError(f"unknown weight format {fmt!r}: known formats are {', '.join(FORMATS)}")
    if FORMATS[name].cpu_only and entry["kind"] != "cpu":
        raise CostProfileError(f"weight format {name} runs on a CPU (llama.cpp), not on {entry['name']}")
    if entry["figures"].get(FORMATS[name].compute) is None:
        raise CostProfileError(f"{entry['name']} has no {name} path ({FORMATS[name].compute} is null); "
                               f"use bf16 or w4a16")
    return name


# ---------------------------------------------------------------------------------------------
# the per-operation roofline


@dataclass(frozen=True)
class Operation:
    """One operation of a pass, summed over layers: its bytes moved, FLOPs, time and what bounds it."""

    name: str
    bytes: float
    flops: float
    ms: float
    bound: str  # "memory" | "compute"


def _op(name: str, nbytes: float, flops: float, bytes_per_ms: float, flops_per_ms: float) -> Operation:
    memory_ms, compute_ms = nbytes / bytes_per_ms, flops / flops_per_ms
    bound = "memory" if memory_ms >= compute_ms else "compute"
    return Operation(name, nbytes, flops, max(memory_ms, compute_ms), bound)


def _operations(shape: ModelShape, rows, contexts, entry, fmt: str, factors, outputs: int | None = None) -> list[Operation]:
    """Each operation of one pass; ``outputs`` is how many rows need logits (the LM head runs on those only: every
    verified position, one a row for a prefill or a draft step; default every row)."""
    figures, f = entry["figures"], FORMATS[fmt]
    bw = figures["memory_bandwidth_gbs"] * 1e9 * factors["bandwidth_efficiency"] / 1e3  # bytes per ms
    rate = lambda which: figures[which] * 1e12 * factors["compute_efficiency"] / 1e3  # noqa: E731  FLOPs per ms
    m, n_layers, hidden, ab = sum(rows), shape.layers, shape.hidden, f.act_bytes
    q_width = shape.heads * shape.head_dim

    def matmul(name, n_in, n_out, wbytes=f.weight_bytes, which=f.compute, layers=n_layers, out_bytes=ab, m=m):
        nbytes = layers * (n_in * n_out * wbytes + m * n_in * ab + m * n_out * out_bytes)  # weights, rows in, rows out
        return _op(name, nbytes, layers * 2.0 * m * n_in * n_out, bw, rate(which))

    kv_tokens = sum(c + r for r, c in zip(rows, contexts))
    attention = _op("attention",
                    n_layers * (kv_tokens * 2 * shape.kv_heads * shape.head_dim * KV_BYTES + 2 * m * q_width * ab),
                    # causal: query i of a row sees its c cached keys and i + 1 of its own (QK^T and PV, 2 FLOPs each)
                    n_layers * sum(4.0 * (r * c + r * (r + 1) / 2) * shape.heads * shape.head_dim
                                   for r, c in zip(rows, contexts)),
                    bw, rate("bf16_tflops"))
    inter = shape.intermediate
    mlp = _op("mlp",  # gate+up (hidden -> 2 x intermediate), then down (intermediate -> hidden)
              n_layers * (3 * hidden * inter * f.weight_bytes + m * (hidden + 2 * inter + inter + hidden) * ab),
              n_layers * 2.0 * m * 3 * hidden * inter, bw, rate(f.compute))
    return [matmul("qkv_proj", hidden, (shape.heads + 2 * shape.kv_heads) * shape.head_dim), attention,
            matmul("o_proj", q_width, hidden), mlp,
            matmul("lm_head", hidden, shape.vocab, f.head_bytes, f.head_compute, layers=1, out_bytes=LOGIT_BYTES,
                   m=m if outputs is None else min(m, outputs))]


def breakdown(shape: ModelShape, rows: Sequence[int], contexts: Sequence[int], device="h100", fmt: str | None = None,
              factors: Mapping | None = None, devices=None) -> list[Operation]:
    """The operations of one forward pass over ``rows`` (query tokens per row) on ``contexts`` (cached tokens per
    row): bytes, FLOPs, ms and bound, each summed over layers. ``device``: an id or a raw device entry."""
    entry = _device(device, devices)
    if len(rows) != len(contexts):
        raise CostProfileError(f"{len(rows)} rows but {len(contexts)} contexts")
    return _operations(shape, rows, contexts, entry, _format(entry, fmt), {**nominal_factors(entry), **(factors or {})})


def overhead_ms(shape: ModelShape, factors: Mapping, role: str) -> float:
    """Launch overhead of one pass (about 10 kernels a layer and a few more), plus the host time per iteration on the
    target pass only: the batched replay charges one target pass per iteration, and the sync reading the accepted
    tokens follows it; the assistant's passes of an iteration run back to back on the device."""
    launch = (shape.layers * KERNELS_PER_LAYER + KERNELS_FIXED) * factors["kernel_us"] / 1e3
    return launch + (factors["host_ms"] if role == "target" else 0.0)


@dataclass
class RooflineCosts:
    """``BatchCosts`` of the pair on a named device, in one weight format, with graphs on or off."""

    device: str
    fmt: str | None = None
    graphs: bool = True
    factors: dict | None = None
    target_shape: ModelShape = TARGET_SHAPE
    assistant_shape: ModelShape = ASSISTANT_SHAPE
    devices: object = None  # a devices file or mapping (None: the shipped devices.json)
    calibrated: bool = False  # factors fitted to measured passes
    note: str = ""
    label: str = ""
    entry: dict = field(default=None, repr=False)

    def __post_init__(self):
        self.entry = _device(self.device, self.devices)
        self.device = self.entry["id"]
        self.fmt = _format(self.entry, self.fmt)
        self.factors = {**nominal_factors(self.entry, self.graphs), **(self.factors or {})}
        if not self.label:
            state = ("calibrated on measured passes" if self.calibrated else
                     f"measured figures: {self.entry['measured']['where']}" if self.entry["measured"] else
                     "uncalibrated")
            default = self.fmt == _format(self.entry, None) and self.graphs
            how = "" if default else f", {self.fmt}{'' if self.graphs else ', eager'}"
            self.label = f"predicted on {self.entry['name']}{how} ({state})" + (f" [{self.note}]" if self.note else "")

    @property
    def profile(self) -> str:
        return f"{PREFIX}{self.device}:{self.fmt}" + ("" if self.graphs else ":eager")

    def with_factors(self, factors: Mapping, calibrated: bool | None = None, note: str = "") -> "RooflineCosts":
        return RooflineCosts(self.entry, self.fmt, self.graphs, dict(factors), self.target_shape, self.assistant_shape,
                             calibrated=self.calibrated if calibrated is None else calibrated, note=note)

    def shape(self, role: str) -> ModelShape:
        return self.target_shape if role == "target" else self.assistant_shape

    def breakdown(self, role: str, rows, contexts, outputs: int | None = None) -> list[Operation]:
        return _operations(self.shape(role), rows, contexts, self.entry, self.fmt, self.factors, outputs)

    def pass_ms(self, role: str, rows: Sequence[int], contexts: Sequence[int], outputs: int | None = None) -> float:
        if not rows:
            return 0.0
        if len(rows) != len(contexts):
            raise CostProfileError(f"{len(rows)} rows but {len(contexts)} contexts")
        ops = self.breakdown(role, rows, contexts, outputs)
        return sum(op.ms for op in ops) + overhead_ms(self.shape(role), self.factors, role)

    def target_ms(self, rows, contexts, outputs: int | None = None) -> float:
        """A target pass; ``outputs``: rows that need logits (default all: verification reads every position)."""
        return self.pass_ms("target", rows, contexts, outputs)

    def assistant_ms(self, rows, contexts, outputs: int | None = None) -> float:
        """An assistant pass; ``outputs`` default one a row (a draft step reads each row's last position only)."""
        return self.pass_ms("assistant", rows, contexts, len(rows) if outputs is None else outputs)


def _parse(text, devices=None) -> tuple[dict, str, bool]:
    """(device entry, weight format, CUDA graphs?) of ``roofline:DEVICE[:FORMAT[:eager]]``."""
    raw = str(text or "").strip()
    parts = raw.lower()[len(PREFIX):].split(":") if raw.lower().startswith(PREFIX) else []
    eager = len(parts) == 3 and parts[2] == "eager"
    if not 1 <= len(parts) <= 3 or not parts[0] or (len(parts) == 3 and not eager):
        raise CostProfileError(f"cost profile {raw!r}: expected roofline:DEVICE, roofline:DEVICE:FORMAT or "
                               "roofline:DEVICE:FORMAT:eager, as in roofline:h100, roofline:h100:fp8 or "
                               "roofline:h100:bf16:eager")
    entry = _device(parts[0], devices)
    return entry, _format(entry, parts[1] if len(parts) >= 2 and parts[1] else None), not eager


def check_roofline(text, devices=None) -> str:
    """The canonical ``roofline:DEVICE:FORMAT`` of a profile; one-line CostProfileError otherwise."""
    entry, fmt, graphs = _parse(text, devices)
    return f"{PREFIX}{entry['id']}:{fmt}" + ("" if graphs else ":eager")


def roofline_costs(profile_text, target_shape: ModelShape | None = None, assistant_shape: ModelShape | None = None,
                   *, graphs: bool = True, factors: Mapping | None = None, devices=None) -> RooflineCosts:
    """``roofline:DEVICE`` (bf16 on a GPU, q4_k_m on ``this``), ``roofline:DEVICE:FORMAT`` or
    ``roofline:DEVICE:FORMAT:eager`` (kernel launches at their eager cost) as BatchCosts; shapes default to the
    embedded pair's."""
    entry, fmt, parsed_graphs = _parse(profile_text, devices)
    graphs = graphs and parsed_graphs
    calibrated = False
    if entry["id"] == "this" and factors is None and devices is None:
        fitted = fitted_this()  # ``profile --fit-roofline`` on this CPU, if it ran
        if fitted is not None:
            factors, calibrated = fitted[0], True
    return RooflineCosts(entry, fmt, graphs, dict(factors or {}), target_shape or TARGET_SHAPE,
                         assistant_shape or ASSISTANT_SHAPE, calibrated=calibrated)


def fit_path() -> Path:
    """Where this machine's fitted ``this`` factors are kept: one file per CPU (model and flags)."""
    return cache.machine_dir() / f"roofline-this-{machine.key_hash(machine.cpu_info())}.json"


def fitted_this() -> tuple[dict, str] | None:
    """(factors, where they were fitted) of ``this`` on this CPU, or None when ``profile --fit-roofline`` never ran
    here (``roofline:this`` is then uncalibrated)."""
    data = cache.read_json(fit_path())
    if not isinstance(data, dict) or not isinstance(data.get("factors"), dict):
        return None
    try:
        factors = {n: float(data["factors"][n]) for n in UNCERTAIN_FACTORS}
    except (KeyError, TypeError, ValueError):
        return None
    return factors, str(data.get("source", "measured passes"))
