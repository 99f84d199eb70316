"""A model pair on the llama.cpp engine: two GGUF files run by llama.cpp (``disco.models.llama``), the tokenizer
transformers reads from the target's GGUF (cached once: reading it from the GGUF takes ~30 s).

It answers what every caller asks of a pair (``disco.models.pair.ModelPair`` is the torch one): ``session(role)``,
``with_assistant(precision)``, ``describe()``, the tokenizer's ``encode`` / ``decode`` / ``token_text``, the EOS
ids, the context length. Assistant precisions of this engine: ``model`` (the GGUF as shipped) and ``q4_0`` (the
assistant re-quantized once with llama.cpp's own quantizer, kept in the cache: Q4_0 has fast AVX2 dot products).
The target is never re-quantized: it defines the output.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from disco import cache
from disco.errors import UserError
from disco.models import llama, precision as prec
from disco.models.pair import ModelLoadError, Tokenized

MODEL = "model"
Q4_0 = "q4_0"
PRECISIONS = (MODEL, Q4_0)


def file_key(path: Path) -> str:
    """A short key of a file's identity (path, size, modification time): what its derived files are named by."""
    stat = Path(path).stat()
    return hashlib.sha1(f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def gguf_tokenizer(path: Path, key: str | None = None):
    """The transformers tokenizer stored in a GGUF file, read once and kept in the cache (``gguf/tokenizer-KEY``)."""
    from transformers import AutoTokenizer

    folder = cache.gguf_dir() / f"tokenizer-{key or file_key(path)}"
    if (folder / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError):
            pass  # a damaged copy: read the GGUF again
    path = Path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read a tokenizer from {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    try:
        tmp = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
        tokenizer.save_pretrained(tmp)
        tmp.replace(folder)
    except OSError:  # a read-only cache, or another process kept it first: read the GGUF again next time
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def file_type(model: llama.LlamaModel) -> str:
    """The GGUF's quantization label (``Q4_K_M``), from the metadata llama.cpp already read. (gguf's GGUFReader
    would parse the whole header again: 9 s for the embedded target's 150k-token vocabulary, most of a cold start.)"""
    from gguf import LlamaFileType

    try:
        code = int(model.meta("general.file_type"))
        return LlamaFileType(code).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        return "gguf"


@dataclass
class GGUFPair(Tokenized):
    name: str
    target_path: Path
    assistant_path: Path
    tokenizer: object
    target_id: str
    assistant_id: str
    target_model: llama.LlamaModel = field(repr=False)
    assistant_model: llama.LlamaModel = field(repr=False)
    eos_ids: tuple[int, ...]
    dtype_name: str = "gguf"
    load_seconds: float = 0.0
    assistant_precision: str = MODEL
    calibration: object = field(default=None, repr=False)
    _shared: dict = field(default_factory=lambda: {"views": {}, "warm": set(), "lock": threading.Lock()}, repr=False)

    engine = "llamacpp"
    device = torch.device("cpu")  # where the sampling numerics run (llama.cpp hands back its logits)
    device_name = "cpu"

    @property
    def exact(self) -> bool:
        return self.target_model.exact

    @property
    def context_length(self) -> int:
        return self.target_model.n_ctx

    def describe(self) -> dict:
        return {"models": self.name, "target": self.target_id, "assistant": self.assistant_id,
                "dtype": self.dtype_name, "device": self.device_name, "assistant_precision": self.assistant_precision,
                "engine": self.engine, "exact": self.exact, "llama_cpp": llama.version(), "threads": llama.threads(),
                "fast_prefill": self.target_model.fast_prefill, "cpu_variant": llama.kernels()}

    def logit_tolerance(self, magnitude: float) -> float:
        """How far this engine's logit for one position can move between batch sizes: 0 in exact mode (rows are
        bit-identical, so any divergence is a bug), else the measured batch-versus-one-token deviation."""
        return 0.0 if self.exact else llama.FAST_MODE_DEVIATION

    def session(self, role: str) -> llama.LlamaSession:
        return (self.target_model if role == "target" else self.assistant_model).session()

    def with_assistant(self, precision: str) -> "GGUFPair":
        """This pair drafting with the assistant in ``precision`` (``model`` or ``q4_0``): a view sharing the target
        and the tokenizer; the Q4_0 file is made once (llama.cpp's quantizer, ~3 s) and kept in the cache."""
        name = prec.check(precision, self.device, engine=self.engine)
        views = self._shared["views"]
        with self._shared["lock"]:
            if not views:
                views[self.assistant_precision] = self
            if name not in views:
                base = views[MODEL]
                path = base.assistant_path if name == MODEL else requantized(base.assistant_path, name)
                model = llama.LlamaModel(path, base.target_model.exact)
                views[name] = replace(base, assistant_model=model, assistant_precision=name,
                                      assistant_id=f"{base.assistant_id} ({name})")
            return views[name]

    def warmup(self) -> None:
        """One small pass per model, once per process, so no timed run pays for lazy initialisation."""
        warm = self._shared["warm"]
        for model in (self.target_model, self.assistant_model):
            if id(model) not in warm:
                session = model.session()  # long enough to take the fast-prefill path (and load its twin) where on
                session.twin_upto = llama.FAST_PREFILL_MIN
                session.forward([self.eos_ids[0]] * (llama.FAST_PREFILL_MIN + 1), 1)
                session.close()
                warm.add(id(model))


def requantized(source: Path, ftype: str) -> Path:
    """``source`` re-quantized to ``ftype`` in the cache (made once)."""
    dest = cache.gguf_dir() / f"{Path(source).stem}-{ftype}-{file_key(source)}.gguf"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _quantize(source, dest, ftype)
    return dest


def _quantize(source, dest, ftype: str = "q4_0") -> None:
    """Re-quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``), atomically."""
    lib = llama.library()
    types = {"q4_0": lib.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": lib.LLAMA_FTYPE_MOSTLY_Q8_0}
    params = lib.llama_model_quantize_default_params()
    params.ftype = types[ftype]
    params.nthread = llama.threads()
    params.allow_requantize = True  # the shipped assistant is Q5_0 / Q8_0: requantizing is the point
    tmp = f"{dest}.{os.getpid()}.partial"  # two processes quantizing the same file never write into one another's
    rc = lib.llama_model_quantize(str(source).encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"llama.cpp could not quantize {source} to {ftype} (code {rc})")
    os.replace(tmp, dest)


def load(name: str, target_path: Path, assistant_path: Path, target_id: str | None = None,
         assistant_id: str | None = None, tokenizer_key: str | None = None, tokenizer=None,
         eos_ids: tuple[int, ...] | None = None) -> GGUFPair:
    """Load a GGUF pair; refuse two models that cannot verify each other's drafts (different vocabularies).
    ``tokenizer`` / ``eos_ids``: used instead of the target GGUF's own (files written without a vocabulary)."""
    start = time.perf_counter()
    for path in (target_path, assistant_path):
        if not Path(path).is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
    exact = llama.exact_mode()
    target = llama.LlamaModel(target_path, exact)
    assistant = llama.LlamaModel(assistant_path, exact)
    if target.n_vocab != assistant.n_vocab:
        raise ModelLoadError(f"{target_path} has {target.n_vocab} tokens but {assistant_path} has {assistant.n_vocab}; "
                             "they cannot verify each other's drafts")
    tokenizer = tokenizer if tokenizer is not None else gguf_tokenizer(Path(target_path), tokenizer_key)
    if len(tokenizer) > target.n_vocab + 16:  # a few specials transformers adds by default (never emitted) are fine
        raise ModelLoadError(f"the tokenizer of {target_path} has {len(tokenizer)} tokens, its model {target.n_vocab}")
    eos = eos_ids[0] if eos_ids else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ModelLoadError(f"{target_path} defines no end-of-sequence token")
    # transformers' EOS, not llama.cpp's wider end-of-generation set (which includes e.g. an ordinary "</s>" token):
    # both engines stop where transformers' generate stops
    pair = GGUFPair(name, Path(target_path), Path(assistant_path), tokenizer,
                    target_id or Path(target_path).name, assistant_id or Path(assistant_path).name,
                    target, assistant, tuple(eos_ids) if eos_ids else (int(eos),), file_type(target))
    if hasattr(tokenizer, "model_max_length"):
        tokenizer.model_max_length = 10**9  # the engine checks lengths against the context itself
    pair.load_seconds = time.perf_counter() - start
    return pair
