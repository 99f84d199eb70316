"""One cache root, one layout, shared by every tab and command (work done once is never redone elsewhere).

``$DISCO_CACHE`` (default ``~/.cache/disco``)::

    models/<role>/        the embedded pair converted to bf16 safetensors (torch engine), one folder per role
    gguf/                 the embedded pair's joined GGUF files and re-quantized assistants (llama.cpp engine)
    tables/               replay tables (the target's greedy output and the assistant's chains), per prompt and pair
    machine/              what this machine measured: numerics decisions, cost profiles, per-pass costs

The Race tab's ``auto`` lane, the This-machine tab, the Sweep tab, ``python -m disco profile|bench|train`` all read
and write these folders, so a table the background profile built is the one a Sweep of the same prompt replays.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("disco.cache")


def root() -> Path:
    """``$DISCO_CACHE`` if set, else ``~/.cache/disco``."""
    env = os.environ.get("DISCO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "disco"


def models_dir() -> Path:
    return root() / "models"


def gguf_dir() -> Path:
    return root() / "gguf"


def tables_dir() -> Path:
    return root() / "tables"


def machine_dir() -> Path:
    return root() / "machine"


def safe_name(name: str) -> str:
    """A file-name-safe version of ``name`` (letters, digits, ``-_.``; at most 60 characters)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:60] or "item"


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` atomically (temp file + rename): an interrupted write never leaves a broken file. Raises
    OSError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    return path


def write_json(path: Path, data: dict, indent: int | None = 1, quiet: bool = True) -> Path | None:
    """Write ``data`` atomically (temp file + rename), so an interrupted write never leaves a broken file. With
    ``quiet``, a cache that cannot be written logs one warning naming the path and returns None (the work is kept in
    memory and measured again next start); otherwise the OSError is raised."""
    try:
        return write_text(path, json.dumps(data, indent=indent, separators=None if indent else (",", ":")))
    except OSError as exc:
        if not quiet:
            raise
        log.warning("could not keep %s in the cache (%s): it will be measured again next time", path,
                    exc.strerror or exc)
        return None


def read_json(path: Path):
    """The parsed file, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
