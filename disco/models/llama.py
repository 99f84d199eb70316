"""llama.cpp (llama-cpp-python's low-level API) behind the one session protocol every caller runs a model through.

A ``LlamaModel`` is one GGUF file loaded once; a ``LlamaSession`` is one sequence's KV cache on it (a llama.cpp
context), with the same three calls as ``disco.models.pair.TorchSession``: ``forward(tokens, keep, interrupt)``
returns the last ``keep`` rows of logits (float32, as a torch tensor sharing nothing with llama.cpp's buffer) and
the pass's ms, ``crop(n)`` removes every cached position from ``n`` on (``llama_memory_seq_rm``), ``length`` is
how many tokens it holds. Contexts are pooled per model, so a race of three lanes does not create six contexts
each time (~50-110 ms apiece, measured on the embedded pair).

Exact mode (the default, ``DISCO_LLAMA_EXACT=1``): a verified row must be the row a one-token pass computes, or
greedy speculative lanes leave the target's own text. In llama.cpp three kernels depend on the batch size (read
in the vendored source and measured, issue 16): weights repacked at load (``use_extra_bufts``; gemm for >= 4 rows,
gemv below), the tiled K-quant matmul (>= 8 rows; ``GGML_CPU_TILED_MM``), llamafile's sgemm (any batch; compiled
out of the wheel this project builds, ``-DGGML_LLAMAFILE=OFF``) and flash attention (a different reduction once
the KV view reaches 512 cells). With all four off, every row of every batch size from 1 to 16, on a 40- and a
340-token cache, was bit-identical to the one-token row on both models of the embedded pair, and so was every
later step computed from a cache written by batches. ``DISCO_LLAMA_EXACT=0`` keeps llama.cpp's defaults (faster
on some CPUs; rows may then differ by up to ~0.6 in a logit, and divergences are labelled against that).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref

import numpy as np
import torch

from disco import limits
from disco.errors import InputError, Interrupted, UserError
from disco.machine import usable_cpus
from disco.models import cpu_variant
from disco.models.background import SHUTDOWN, exiting, in_pass

EXACT_ENV = "DISCO_LLAMA_EXACT"
FAST_PREFILL_ENV = "DISCO_LLAMA_FAST_PREFILL"
FAST_PREFILL_MIN = 8  # a shorter prefix is not worth a second context and a copy of the cache
THREADS_ENV = "DISCO_LLAMA_THREADS"
N_CTX_ENV = "DISCO_LLAMA_CTX"
DEFAULT_N_CTX = 4096
N_BATCH = 512
# the largest batch-versus-one-token difference of a logit measured outside exact mode (embedded pair, k <= 16)
FAST_MODE_DEVIATION = 0.65


class LlamaUnavailable(UserError, RuntimeError):
    """llama-cpp-python is not installed here (or cannot load): the torch engine still works."""


_LIB = None
_LOCK = threading.Lock()


def exact_mode() -> bool:
    return os.environ.get(EXACT_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


def fast_prefill_mode() -> bool:
    """Whether exact sessions prefill on a repacked twin of their model (``DISCO_LLAMA_FAST_PREFILL=1``; off by
    default: the twin holds a second, repacked copy of the weights)."""
    return os.environ.get(FAST_PREFILL_ENV, "0").strip().lower() in ("1", "on", "yes", "true")


def library():
    """llama_cpp's low-level module, initialised once (quiet logging, the exact-mode kernel switch); raises
    LlamaUnavailable with one line when it cannot be imported."""
    global _LIB
    with _LOCK:
        if _LIB is not None:
            return _LIB
        if exact_mode():
            # read once by ggml, on its first matmul: must be set before anything runs
            os.environ["GGML_CPU_TILED_MM"] = "0"
        try:
            import llama_cpp as lib
        except Exception as exc:  # ImportError, or an OSError from a shared library built for another CPU
            raise LlamaUnavailable(f"the llama.cpp engine is not available here ({type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); scripts/setup.sh "
                                   "builds llama-cpp-python, or use --engine torch") from None
        lib.llama_log_set(_QUIET, ctypes.c_void_p(0))  # llama.cpp and ggml both print to stderr otherwise
        try:  # a build with one CPU backend per instruction set registers the one this CPU runs best
            cpu_variant.load(os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(os.path.dirname(lib.__file__), "lib"))
        except cpu_variant.VariantError as exc:
            raise LlamaUnavailable(f"the llama.cpp engine cannot start: {exc}") from None
        lib.llama_backend_init()
        _LIB = lib
        return lib


def available() -> str | None:
    """None when the engine can run here, else why not (one line)."""
    try:
        library()
    except LlamaUnavailable as exc:
        return str(exc)
    return None


def version() -> str | None:
    try:
        return library().__version__
    except LlamaUnavailable:
        return None


def kernels() -> str | None:
    """The CPU variant of llama.cpp's kernels this process runs (``disco.models.cpu_variant``), or None for a build
    with one CPU backend linked in (or where the engine is not available)."""
    try:
        library()
    except LlamaUnavailable:
        return None
    chosen = cpu_variant.loaded()
    return chosen.name if chosen else None


def runnable_variants() -> list:
    """The CPU variants built here that this CPU runs, best first (``cpu_variant.Variant``), the opt-in ones (AMX)
    only when this process runs one; empty for a build with one CPU backend linked in."""
    kernels()  # loads the library, and with it the variant
    return cpu_variant.runnable()


def child_env(env: dict) -> dict:
    """``env`` for one of llama.cpp's own programs, naming the CPU variant this process runs (where the build has
    several), so they compute with the same kernels."""
    if kernels() is None:
        return env
    return cpu_variant.child_env(env)


def _quiet(level, text, user_data):
    return None


def _make_quiet():
    import ctypes as c

    return c.CFUNCTYPE(None, c.c_int, c.c_char_p, c.c_void_p)(_quiet)


_QUIET = _make_quiet()  # kept alive for the process: llama.cpp holds the pointer


MAX_THREADS, MAX_N_CTX = 512, 1 << 20


def _env_int(name: str, lo: int, hi: int) -> int | None:
    """An operator's whole number (None when unset), refused in one line as every other operator variable is."""
    try:
        return limits.env_int(name, None, lo, hi)
    except InputError as exc:
        raise LlamaUnavailable(str(exc)) from None


def threads() -> int:
    """llama.cpp's threads: ``DISCO_LLAMA_THREADS``, else every CPU this process may use."""
    chosen = _env_int(THREADS_ENV, 1, MAX_THREADS)
    if chosen is not None:
        return chosen
    return max(1, usable_cpus())


def n_ctx() -> int:
    """The context length of llama.cpp's contexts: ``DISCO_LLAMA_CTX`` (256 and up), else 4096."""
    chosen = _env_int(N_CTX_ENV, 256, MAX_N_CTX)
    return DEFAULT_N_CTX if chosen is None else chosen


class LlamaModel:
    """One GGUF file loaded with llama.cpp (weights memory-mapped), and a pool of contexts on it."""

    def __init__(self, path, exact: bool | None = None, repack: bool | None = None, fast_prefill: bool | None = None):
        lib = library()
        self.lib = lib
        self.path = str(path)
        self.exact = exact_mode() if exact is None else exact
        self.repack = (not self.exact) if repack is None else repack
        # exact sessions may prefill on a repacked twin (``prefill_twin``); decode passes stay on this model
        self.fast_prefill = self.exact and not self.repack and (fast_prefill_mode() if fast_prefill is None
                                                                 else fast_prefill)
        self._twin: LlamaModel | None = None
        self._twin_lock = threading.Lock()  # not the pool's lock: a load takes seconds, and a finalizer may release
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = self.repack  # repacked weights compute gemm and gemv rows differently
        model = lib.llama_model_load_from_file(self.path.encode(), params)
        if not model:
            raise UserError(f"llama.cpp could not load {self.path} (not a GGUF model it supports?)")
        self.model = model
        self.vocab = lib.llama_model_get_vocab(model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx = min(n_ctx(), int(lib.llama_model_n_ctx_train(model)) or n_ctx())
        self.n_threads = threads()
        self._free: list = []
        self._lock = threading.Lock()
        self.contexts_made = 0  # contexts created (the rest of the time one comes back from the pool)
        weakref.finalize(self, _free_model, lib, model, self._free)

    def meta(self, key: str) -> str | None:
        """A metadata value of the GGUF as llama.cpp read it (``general.file_type``), or None where it has none."""
        buf = ctypes.create_string_buffer(256)
        n = self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, ctypes.sizeof(buf))
        return buf.value.decode(errors="replace") if n >= 0 else None

    def context(self):
        """A context from the pool (its memory cleared), or a new one."""
        with self._lock:
            ctx = self._free.pop() if self._free else None
        if ctx is not None:
            self.lib.llama_memory_clear(self.lib.llama_get_memory(ctx), True)
            return ctx
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = self.n_ctx
        params.n_batch = N_BATCH
        params.n_ubatch = N_BATCH
        params.n_seq_max = 1
        params.n_threads = self.n_threads
        params.n_threads_batch = self.n_threads
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_DISABLED if self.exact
                                  else lib.LLAMA_FLASH_ATTN_TYPE_AUTO)
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model, params)
        self.contexts_made += 1
        if not ctx:
            raise UserError(f"llama.cpp could not create a context of {self.n_ctx} tokens for {self.path} "
                            f"(out of memory? set {N_CTX_ENV} lower)")
        return ctx

    def release(self, ctx) -> None:
        with self._lock:
            self._free.append(ctx)

    def prefill_twin(self) -> "LlamaModel":
        """This file loaded again with repacked weights (llama.cpp's fast gemm for batches) and this model's context
        layout (flash attention off, so its cache can be handed over): loaded on the first prefill that uses it."""
        if self._twin is None:
            with self._twin_lock:
                if self._twin is None:
                    self._twin = LlamaModel(self.path, exact=True, repack=True, fast_prefill=False)
        return self._twin

    def session(self) -> "LlamaSession":
        return LlamaSession(self)


def _free_model(lib, model, contexts) -> None:
    for ctx in contexts:
        lib.llama_free(ctx)
    contexts.clear()
    lib.llama_model_free(model)


class _Abort:
    """The abort callback of one pass: polled by llama.cpp after every graph node (from its first thread), it
    asks the caller's ``interrupt``; llama_decode then returns 2 and drops the interrupted micro-batch."""

    def __init__(self, lib):
        self.interrupt = None
        self.fired = False
        self.callback = lib.ggml_abort_callback(self._poll)

    def _poll(self, _data) -> bool:
        if self.fired:
            return True
        if SHUTDOWN.is_set():  # the process is exiting (disco.models.background)
            self.fired = True
            return True
        if self.interrupt is None:
            return False
        try:
            self.fired = bool(self.interrupt())
        except Exception:  # a failing Stop check must not take the process down from inside C
            self.fired = True
        return self.fired


class LlamaSession:
    """One sequence's KV cache on one llama.cpp model (see the module doc)."""

    def __init__(self, model: LlamaModel):
        lib = model.lib
        self.model = model
        self.lib = lib
        self.ctx = model.context()
        self.length = 0
        # where a first pass may stop prefilling on the model's repacked twin (``fast_prefill``): set by the caller to
        # the prompt's length less one, so every session of a prompt shares that prefix's cache; None: never
        self.twin_upto: int | None = None
        self._batch = lib.llama_batch_init(N_BATCH, 0, 1)
        self._abort = _Abort(lib)
        lib.llama_set_abort_callback(self.ctx, self._abort.callback, None)
        self._finalizer = weakref.finalize(self, _release, model, self.ctx, lib, self._batch)

    def close(self) -> None:
        """Give the context back to the model's pool now (garbage collection would, later: a decoder and its core
        refer to each other, so only a full collection frees them, and meanwhile every run made new contexts,
        ~120 MB each; a sampling study of 576 runs reached 9.5 GB). The session cannot be used afterwards."""
        self._finalizer()
        self.ctx = None

    def forward(self, tokens: list[int], keep: int = 1, interrupt=None) -> tuple[torch.Tensor, float]:
        """Feed ``tokens`` at the end of the cache (in micro-batches of at most N_BATCH); return the last ``keep``
        rows of logits in float32 and the pass's ms. ``interrupt`` is polled before the pass and during it
        (raises ``Interrupted``; the cache then holds a prefix of the pass, and the caller discards it)."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        if self.ctx is None:
            raise RuntimeError("forward() on a closed llama.cpp session")
        if self.length + len(tokens) > self.model.n_ctx:
            raise UserError(f"the sequence would exceed llama.cpp's context of {self.model.n_ctx} tokens "
                            f"({N_CTX_ENV} sets it)")
        if exiting() or (interrupt is not None and interrupt()):
            raise Interrupted("stopped before a forward pass")
        lib, batch, n = self.lib, self._batch, len(tokens)
        first_kept = n - keep  # rows before it need no logits
        prefix = min(first_kept, self.twin_upto or 0)
        if self.length == 0 and self.model.fast_prefill and prefix >= FAST_PREFILL_MIN:
            start = time.perf_counter()
            self._prefill_on_twin(tokens[:prefix], interrupt)
            logits, _ = self.forward(tokens[prefix:], keep, interrupt)  # the rest, and every row asked for: exact
            return logits, (time.perf_counter() - start) * 1000.0
        rows: list[np.ndarray] = []
        self._abort.interrupt, self._abort.fired = interrupt, False
        start = time.perf_counter()
        try:
            for lo in range(0, n, N_BATCH):
                chunk = tokens[lo:lo + N_BATCH]
                for i, token in enumerate(chunk):
                    batch.token[i] = int(token)
                    batch.pos[i] = self.length + lo + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1 if lo + i >= first_kept else 0
                batch.n_tokens = len(chunk)
                with in_pass():  # the process's exit waits for it (disco.models.background)
                    rc = lib.llama_decode(self.ctx, batch)
                if rc == 2 or self._abort.fired:
                    self.length = max(0, lib.llama_memory_seq_pos_max(lib.llama_get_memory(self.ctx), 0) + 1)
                    raise Interrupted("stopped inside a forward pass")
                if rc != 0:
                    raise RuntimeError(f"llama_decode failed with code {rc}")
                wanted = lo + len(chunk) - max(first_kept, lo)
                if wanted > 0:  # llama.cpp reuses its logits buffer on the next decode: copy now
                    view = np.ctypeslib.as_array(lib.llama_get_logits(self.ctx), shape=(wanted, self.model.n_vocab))
                    rows.append(view.copy())
            self.length += n
        finally:
            self._abort.interrupt = None
        logits = torch.from_numpy(rows[0] if len(rows) == 1 else np.concatenate(rows))
        return logits, (time.perf_counter() - start) * 1000.0

    def _prefill_on_twin(self, prefix: list[int], interrupt) -> None:
        """Prefill ``prefix`` on the model's repacked twin and copy the cache into this session's context
        (``llama_state_seq_get_data`` / ``set_data``). Every session of a prompt (each lane's target and assistant, the
        replay table's) stops the twin at the same place (``twin_upto``: the prompt but its last token), so they share
        that prefix's cache; everything after it, and every row a policy reads, comes from exact passes."""
        lib = self.lib
        twin = self.model.prefill_twin().session()
        try:
            twin.forward(prefix, 1, interrupt)
            size = lib.llama_state_seq_get_size(twin.ctx, 0)
            buf = (ctypes.c_uint8 * size)()
            got = lib.llama_state_seq_get_data(twin.ctx, buf, size, 0)
            put = lib.llama_state_seq_set_data(self.ctx, buf, got, 0) if got == size else 0
        finally:
            twin.close()
        if put != size:
            raise RuntimeError(f"llama.cpp could not hand over a prefilled cache ({got} of {size} bytes read, "
                               f"{put} written); unset {FAST_PREFILL_ENV}")
        self.length = len(prefix)

    def crop(self, length: int) -> None:
        if self.ctx is None:
            raise RuntimeError("crop() on a closed llama.cpp session")
        if length < self.length:
            self.lib.llama_memory_seq_rm(self.lib.llama_get_memory(self.ctx), 0, int(length), -1)
            self.length = int(length)


def _release(model: LlamaModel, ctx, lib, batch) -> None:
    lib.llama_set_abort_callback(ctx, lib.ggml_abort_callback(), None)
    lib.llama_batch_free(batch)
    model.release(ctx)
