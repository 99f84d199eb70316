"""This machine's measured choice of engine for a pair (``auto``): which engine runs the pair fastest here, written
once both engines' profiles exist (``disco.costs.engines.decide``), read by ``resolve_engine`` for ``--engine auto`` /
``DISCO_ENGINE=auto``. A file in the machine cache, keyed by this CPU (model, flags), the pair and the device, like
the numerics decision: another machine measures again. Only the reading and writing live here (the models layer);
deciding reads the profiles, a layer above."""

from __future__ import annotations

import hashlib
import json

from disco import cache
from disco.machine import cpu_info


def _key(models: str, device: str = "cpu") -> dict:
    info = cpu_info()
    return {"models": models.strip(), "device": device, "cpu": info["cpu"], "flags": info["flags"]}


def path_for(models: str, device: str = "cpu"):
    blob = json.dumps(_key(models, device), sort_keys=True).encode()
    return cache.machine_dir() / f"engine-{hashlib.sha1(blob).hexdigest()[:16]}.json"


def load(models: str, device: str = "cpu") -> dict | None:
    """The decision for this machine and pair (``engine``, ``lane``, ``reason``, ...), or None."""
    data = cache.read_json(path_for(models, device))
    if not isinstance(data, dict) or data.get("key") != _key(models, device) or data.get("engine") not in ("llamacpp",
                                                                                                             "torch"):
        return None
    return data


def save(models: str, decision: dict, device: str = "cpu"):
    return cache.write_json(path_for(models, device), {**decision, "key": _key(models, device)})
