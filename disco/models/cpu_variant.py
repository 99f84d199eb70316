"""Which of llama.cpp's CPU kernels this process runs, in a build that holds several (issue 24).

``scripts/llama-build.sh`` builds ggml's CPU backend once per x86 instruction-set level (ggml's
``GGML_BACKEND_DL`` + ``GGML_CPU_ALL_VARIANTS``): ``libggml-cpu-x64.so`` (plain x86-64), ``-haswell`` (AVX2,
the kernels of the earlier portable build), ``-skylakex`` / ``-icelake`` / ``-zen4`` (AVX-512 with VBMI, VNNI,
BF16), ``-sapphirerapids`` (AMX) ... beside ``libllama.so``. Nothing is linked in: before the first model loads, one
variant must be registered (``ggml_backend_load``). ggml's own ``ggml_backend_load_all`` would pick the
best-scoring one silently; this module makes the same choice itself (each variant's ``ggml_backend_score``, read
in ``ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp``: 0 where this CPU lacks a feature the variant was compiled for,
else higher for more features) so that the choice is known (cache keys, the This machine tab, ``profile``), can be
named (``DISCO_LLAMA_CPU_VARIANT=haswell``: e.g. to compare kernels, or to keep an older table's numerics), and
leaves AMX out unless named: a native AMX build crashed on its first decode on an Intel Xeon (issue 24) and no
AMX machine has been available to find why, so ``sapphirerapids`` is built but chosen only by name.

Rows differ between variants (other SIMD widths sum in another order), so a table or a cost profile is filed
under the variant that computed it; within one variant exact mode keeps every verified row equal to the
one-token row (tests/unit/test_cpu_variants.py checks each variant this CPU runs).
A build without variant modules (one CPU backend linked in: other platforms, or ``CMAKE_ARGS="-DGGML_BACKEND_DL=OFF
-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_NATIVE=ON"``) needs nothing loaded: ``choose`` returns None and keys stay as they
were. A build with loadable backends but none named ``libggml-cpu-NAME.so`` (e.g. ``GGML_BACKEND_DL`` alone) gets
ggml's own ``ggml_backend_load_all_from_path``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from disco.errors import UserError

VARIANT_ENV = "DISCO_LLAMA_CPU_VARIANT"
OPT_IN = frozenset({"sapphirerapids"})  # built, chosen only when named (see the module's text)
_FILE = re.compile(r"^libggml-cpu-(?P<name>[A-Za-z0-9_.]+)\.so$")

log = logging.getLogger(__name__)


class VariantError(UserError, RuntimeError):
    """The named variant is not built here or this CPU cannot run it; or none of the built ones runs here."""


@dataclass(frozen=True)
class Variant:
    name: str
    path: str
    score: int  # ggml's: 0 = this CPU cannot run it

    @property
    def runs_here(self) -> bool:
        return self.score > 0


def _ggml_score(path: str) -> int:
    """The variant's own ``ggml_backend_score()`` (loads the module, asks, unloads it: ggml's loader does the same)."""
    import _ctypes

    handle = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    try:
        fn = handle.ggml_backend_score
        fn.restype, fn.argtypes = ctypes.c_int, []
        return int(fn())
    except AttributeError:
        return 0
    finally:
        _ctypes.dlclose(handle._handle)


def built(libdir: str | os.PathLike, score=_ggml_score) -> list[Variant]:
    """Every variant module in ``libdir``, with this CPU's score for it, best first."""
    found = []
    for entry in sorted(Path(libdir).iterdir()) if Path(libdir).is_dir() else []:
        m = _FILE.match(entry.name)
        if m:
            try:
                found.append(Variant(m["name"], str(entry), score(str(entry))))
            except OSError as exc:  # a module that cannot load here (e.g. built for another platform)
                log.warning("llama.cpp CPU variant %s does not load here: %s", entry.name, exc)
                found.append(Variant(m["name"], str(entry), 0))
    return sorted(found, key=lambda v: (-v.score, v.name))


def choose(variants: list[Variant], wanted: str | None = None) -> Variant | None:
    """The variant to load: the one named (``wanted``), else the best-scoring one this CPU runs that is not
    opt-in; None when the build has no variant modules. Raises VariantError (one line) when the named one is
    missing or cannot run here, or when none of the built ones runs here."""
    if not variants:
        if wanted:
            raise VariantError(f"{VARIANT_ENV}={wanted}: this llama.cpp build has one CPU backend linked in, no "
                               "variants to choose from (scripts/llama-build.sh builds them on x86-64)")
        return None
    runnable = [v for v in variants if v.runs_here]
    if wanted:
        named = [v for v in variants if v.name == wanted]
        if not named or not named[0].runs_here:
            why = "is not built here" if not named else "needs instructions this CPU lacks"
            raise VariantError(f"{VARIANT_ENV}={wanted} {why}; this CPU runs: "
                               f"{', '.join(v.name for v in runnable) or 'none of them'}")
        return named[0]
    default = [v for v in runnable if v.name not in OPT_IN]
    if not default:
        raise VariantError("none of llama.cpp's CPU variants built here runs on this CPU "
                           f"({', '.join(v.name for v in variants)})")
    return default[0]


def wanted() -> str | None:
    name = os.environ.get(VARIANT_ENV, "").strip()
    return name or None


_LOADED: Variant | None = None
GGML_SONAME = "libggml.so.0"  # what libllama names in its DT_NEEDED


def _ggml_of_libllama():
    """The libggml instance libllama runs on (its backend registry is the one that counts). A wheel holds no
    symlinks, so libggml.so and libggml.so.0 are two files: opening the first by path would load a second, empty
    registry. By soname, without loading anything, glibc gives the instance already loaded."""
    try:
        return ctypes.CDLL(GGML_SONAME, mode=os.RTLD_NOLOAD)
    except OSError:
        raise VariantError(f"{GGML_SONAME} is not loaded: llama-cpp-python's libllama was built another way") from None


def load(libdir: str | os.PathLike) -> Variant | None:
    """Register the chosen variant with ggml (once per process, before any model loads); returns it, or None for a
    build with its CPU backend linked in."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    chosen = choose(built(libdir), wanted())
    if chosen is None:
        _ensure_a_backend(libdir)
        return None
    ggml = _ggml_of_libllama()
    ggml.ggml_backend_load.restype, ggml.ggml_backend_load.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    if not ggml.ggml_backend_load(chosen.path.encode()):
        raise VariantError(f"ggml could not load its CPU backend {chosen.path}")
    log.info("llama.cpp CPU kernels: %s (score %d)", chosen.name, chosen.score)
    _LOADED = chosen
    return chosen


def _ensure_a_backend(libdir) -> None:
    """A build without variant modules: its CPU backend is linked in (ggml's registry already holds it), or it is one
    loadable module ggml finds itself; raises VariantError when llama.cpp would have no backend at all."""
    try:
        ggml = _ggml_of_libllama()
    except VariantError:  # another platform's naming (e.g. macOS): its build links the backend in
        return
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_reg_count() == 0:
        ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_load_all_from_path(str(libdir).encode())
        if ggml.ggml_backend_reg_count() == 0:
            raise VariantError(f"llama.cpp found no CPU backend in {libdir}: rebuild it with scripts/llama-build.sh")


def runnable(with_opt_in: bool = False) -> list[Variant]:
    """The variants built beside the loaded one that this CPU runs, best first; the opt-in ones (AMX) only with
    ``with_opt_in`` or when it is the one loaded. Empty where no variant was loaded (a linked build)."""
    if _LOADED is None:
        return []
    return [v for v in built(Path(_LOADED.path).parent)
            if v.runs_here and (with_opt_in or v.name not in OPT_IN or v.name == _LOADED.name)]


def loaded() -> Variant | None:
    return _LOADED


def child_env(env: dict) -> dict:
    """``env`` for one of llama.cpp's own programs (llama-bench, the speculative example), so it runs the same
    variant as this process: they call ``ggml_backend_load_all``, which finds no module beside themselves and then
    loads ``GGML_BACKEND_PATH``."""
    if _LOADED is None:
        return env
    return {**env, "GGML_BACKEND_PATH": _LOADED.path}
