"""Files of the model cache: replacing a folder atomically (a failed rename never deletes data), the cache's lock
between processes, and folder sizes. Used by the embedded pair's preparation (``disco.models.embedded``)."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

TMP_PREFIX = ".tmp-"
LOCK_NAME = ".lock"
Log = Callable[[str], None]


def swap_into_place(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``; an earlier ``target`` (outdated or broken) is moved aside first and deleted
    only once ``source`` is in place, and put back if the rename fails: a failed rename never deletes data."""
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f"{TMP_PREFIX}replaced-{target.name}-{os.getpid()}") if target.exists() else None
    if aside is not None:
        os.rename(target, aside)
    try:
        os.rename(source, target)
    except OSError:
        if aside is not None:
            os.rename(aside, target)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


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


# --------------------------------------------------------------------------- conversion


@contextmanager
def locked(cache: Path, log: Log, wait: bool = True) -> Iterator[bool]:
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


def remove_orphaned_partials(folder: Path) -> None:
    """Remove the half-written ``NAME.PID.partial`` files and folders in ``folder`` whose process is gone (killed
    mid-write: a re-quantization, a kept tokenizer); a living process's stay."""
    for path in folder.glob("*.partial"):
        pid = path.name.rsplit(".", 2)[-2] if path.name.count(".") >= 2 else ""
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or another user's: PermissionError below)
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
