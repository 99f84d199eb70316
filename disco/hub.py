"""Whether the Hugging Face Hub can be reached from here: one quick probe shared by the model loader and the hub
datasets of ``disco.suites``, so an offline machine fails in seconds with a line saying what to do, not after a
minute of retries inside transformers or datasets."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

OFFLINE_ENVS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_mode() -> bool:
    """The user asked for offline mode (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set to anything but 0)."""
    return any(os.environ.get(name, "").strip() not in ("", "0") for name in OFFLINE_ENVS)


def reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the Hub's endpoint (``HF_ENDPOINT``) opens within ``timeout`` seconds; False in offline
    mode."""
    if offline_mode():
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False
