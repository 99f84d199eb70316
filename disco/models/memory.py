"""What a pair costs in memory on an engine, and what this machine (or its container) has free: so a hosted app loads
a second engine's pair only when it fits, and never converts weights inside a visitor's request.

Measured on the embedded pair (docs/app.md, "The embedded model pair"): llama.cpp maps the 1.6 GB of GGUF files (2.2 GiB
resident for the whole app); the torch engine holds both models in bf16 (3.5 GiB for the app), after a one-time
conversion that peaks at 8.6 GiB. A pair's need is estimated from its weight files (GGUF files, safetensors or bin
files of a folder) times ``OVERHEAD`` (activations, caches, the runtime), never from a guess about the model's name.
"""

from __future__ import annotations

from pathlib import Path

from disco.errors import UserError
from disco.models import embedded
from disco.models.load import EMBEDDED, TINY, parse_models_spec

OVERHEAD = 1.25  # resident memory over the weights' bytes (embedded pair: 2.2 GiB for 1.6 GB of GGUF, 3.5 for 3.1)
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin")  # in a folder, the first format found is the one counted


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


CGROUPS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),                       # v2
           ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))  # v1
NO_LIMIT = 1 << 60  # cgroup v1 writes a huge number for "no limit"


def _cgroup_available() -> int | None:
    """A container's room (its memory limit less its use, v2 or v1), or None without a limit."""
    for limit_file, used_file in CGROUPS:
        try:
            limit = Path(limit_file).read_text().strip()
            used = int(Path(used_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= NO_LIMIT:
            return None
        return max(0, int(limit) - used)
    return None


def available_bytes() -> int | None:
    """Memory this process can still take: the smaller of the machine's available memory and its container's room
    (None where neither can be read)."""
    found = [x for x in (_meminfo_available(), _cgroup_available()) if x is not None]
    return min(found) if found else None


def weight_bytes(paths) -> int:
    """The bytes of the weight files at ``paths`` (files, or folders searched for weight files)."""
    total = 0
    for path in map(Path, paths):
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            # one format per folder: safetensors where there are any (a folder may keep .bin copies beside them)
            for suffix in WEIGHT_SUFFIXES:
                files = [p for p in path.rglob(f"*{suffix}") if p.is_file()]
                if files:
                    total += sum(p.stat().st_size for p in files)
                    break
    return total


def need_bytes(paths) -> int:
    """What loading a pair with these weight files takes, resident (``OVERHEAD`` over the weights)."""
    return int(weight_bytes(paths) * OVERHEAD)


def shortfall(paths, copies: int = 1) -> tuple[int, int] | None:
    """``(need, free)`` when ``copies`` resident copies of these weights do not fit the free memory, else None (also
    when the free memory cannot be read)."""
    need, free = need_bytes(paths) * copies, available_bytes()
    return (need, free) if free is not None and need > free else None


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


class NotPrepared(UserError):
    """The pair's weights for this engine are not on disk yet (a conversion or a join is needed first)."""


def pair_weights(spec: str, engine: str) -> list[Path] | None:
    """The weight files ``spec`` loads on ``engine`` (None where they cannot be known without loading: hub ids not in
    a local folder, the tiny pair built in code). Raises NotPrepared where the engine needs a one-time conversion that
    has not been made (the embedded pair on torch)."""
    spec = spec.strip()
    if spec == TINY:
        return None
    if spec == EMBEDDED:
        roles = ("target", "assistant")
        if engine == "torch":
            folders = [embedded.model_dir(role) for role in roles]
            if not all(embedded.is_ready(folder, role) for folder, role in zip(folders, roles)):
                raise NotPrepared("the torch engine needs the embedded pair converted to bf16 once (about 2.5 "
                                  "minutes and 8.6 GiB of memory): run `python -m disco models prepare --engine torch`")
            return folders
        return [embedded.gguf_file(role) for role in roles]
    target, assistant = parse_models_spec(spec)
    paths = [Path(target).expanduser(), Path(assistant).expanduser()]
    return paths if all(p.exists() for p in paths) else None
