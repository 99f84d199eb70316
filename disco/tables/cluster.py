"""Replay tables built on a Ray cluster (``--ray ADDRESS``, or ``--ray local`` to start Ray on this machine).

A table is a pure function of (pair, prompt, run length, the grid whose chains it must hold), and building it is
the expensive part of every benchmark. So the driver (the command the user runs) sends the prompts whose tables are
not cached yet to ``TableWorker`` actors, one per slot (``--ray-threads`` CPUs each, or ``--ray-gpus`` GPUs), each
loading the pair once; a worker builds a question's tables (a multi-turn question's turns in order, on one worker)
in a scratch folder with the same code as a sequential build (``disco.tables.phase.Here``) and sends the files
back; the driver writes them into the one cache atomically. Then the command goes on exactly as without Ray: every
table is found in the cache (``disco.tables.workers.OnRay``: the cache is a cluster build's only result).

* Resumable: prompts whose cached table already holds what the grid needs are not sent; a table that lacks chain
  tokens is sent along and extended, as a sequential build would extend it (the same bytes).
* Failures: a worker that cannot load the pair is named with its error (the run goes on with the others, or stops
  with that line when none can); a worker that dies mid-question has that question sent to another worker (at most
  ``ATTEMPTS`` tries), and nothing of a question enters the cache before all its files have arrived.
* Same bytes: a table holds only what the models compute (``disco.replay.tables``: no timings, no thread counts), so
  a cluster's table equals a sequential build's on the same kind of machine (tests). Machines with different kernels
  can differ at near-ties, as any two machines can.
* Costs: ``--cost-profile measured`` still measures this machine's passes (the driver loads the pair for that); a
  ``flat:C`` profile or a CSV from ``profile --csv`` on the cluster's machines needs no model here at all.

Ray's own scheduling (actors, ``ray.wait``) does the distribution; nothing here is a home-made scheduler beyond the
retry of a lost question. This module connects to the cluster and reads its options; ``disco.tables.workers`` runs
the build.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import disco
from disco.errors import BenchError, UserError, first_line
from disco.machine import usable_cpus

LOCAL = "local"
ENV_PREFIXES = ("DISCO_", "HF_", "GGML_", "ONEDNN_", "OMP_")  # what the driver's environment passes to the workers
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterConfig:
    address: str                      # "local", or what ray.init takes: HOST:PORT, ray://HOST:10001, auto
    workers: int | None = None        # actors (default: as many as the cluster's slots hold)
    threads: int = 2                  # CPUs per worker: its llama.cpp / torch threads
    gpus: float = 0.0                 # GPUs per worker
    runtime_env: dict = field(default_factory=dict)  # merged into the workers' runtime_env (pip, env_vars, hooks)


def ray_module():
    try:
        import ray
    except ImportError:
        raise BenchError("--ray needs Ray: pip install -r requirements-ray.txt") from None
    return ray


def _runtime_env(cfg: ClusterConfig) -> dict:
    """Ships this checkout's ``disco`` package and the environment that changes what a table holds."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) and k != "DISCO_LLAMA_THREADS"}
    runtime = {"py_modules": [str(Path(disco.__file__).parent)], "env_vars": env}
    extra = dict(cfg.runtime_env)
    runtime["env_vars"] = {**env, **extra.pop("env_vars", {})}
    runtime.update(extra)
    return runtime


def _probe(address: str, timeout: float = 5.0) -> None:
    """A TCP connection to HOST:PORT (or ray://HOST:PORT) within ``timeout``, so an unreachable cluster is one line in
    seconds (``ray.init`` itself retries for minutes); other address forms are left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise BenchError(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc} (start one with "
                         "`ray start --head`, give its address, or use --ray local)") from None


def connect(cfg: ClusterConfig):
    """``ray.init`` on the address (a local Ray for ``local``); one line when the cluster cannot be reached."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    if cfg.address != LOCAL:
        _probe(cfg.address)
    quiet = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}
    try:
        if cfg.address == LOCAL:
            # address="local": a Ray of our own even where `ray start` already runs one on this machine; workers at
            # niceness 0, not Ray's default 15: the tables are the job (at 15, two busy processes on a 2-core machine
            # left each worker about 5 % of a core)
            ray.init(address="local",
                     num_cpus=usable_cpus(),
                     object_store_memory=256 * 1024 ** 2, runtime_env=_runtime_env(cfg),
                     _system_config={"worker_niceness": 0}, **quiet)
        else:
            ray.init(address=cfg.address, runtime_env=_runtime_env(cfg), **quiet)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError: all one line
        log.debug("ray.init failed", exc_info=True)
        raise BenchError(f"cannot reach the Ray cluster at {cfg.address!r}: {first_line(exc)[:200]} (start one with "
                         "`ray start --head`, give its address, or use --ray local)") from None
    return ray


def slots(ray, cfg: ClusterConfig) -> int:
    """How many workers the cluster holds (``cfg.workers`` if given)."""
    if cfg.workers:
        return cfg.workers
    res = ray.cluster_resources()
    by_cpu = int(res.get("CPU", 0) // max(1, cfg.threads))
    by_gpu = int(res.get("GPU", 0) // cfg.gpus) if cfg.gpus else by_cpu
    return max(1, min(by_cpu, by_gpu))


def cause(exc: BaseException) -> str:
    """The user-facing line inside a Ray error (the worker's own exception where Ray kept it)."""
    wrapped = getattr(exc, "cause", None) or getattr(exc, "__cause__", None)
    inner = wrapped if isinstance(wrapped, BaseException) else exc
    if isinstance(inner, UserError):
        return first_line(inner)
    text = str(inner)
    for line in text.splitlines():  # Ray's wrapper puts the worker's "Type: message" on a line of its own
        if ("Error" in line or "Exception" in line) and ":" in line and not line.startswith(("Traceback", "  ")):
            return line.strip()[:300]
    return first_line(inner)[:300]


def add_arguments(p) -> None:
    g = p.add_argument_group("Ray cluster (replay tables built in parallel; pip install -r requirements-ray.txt)")
    g.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="build the replay tables on a Ray cluster: local (starts Ray on this machine) or the address "
                        "ray.init takes (HOST:PORT, ray://HOST:10001, auto)")
    g.add_argument("--ray-workers", type=int, default=None, metavar="N",
                   help="workers (default: as many as the cluster's CPUs / --ray-threads, or GPUs / --ray-gpus)")
    g.add_argument("--ray-threads", type=int, default=2, metavar="T", help="CPUs (threads) per worker (default 2)")
    g.add_argument("--ray-gpus", type=float, default=0.0, metavar="G", help="GPUs per worker (default 0)")
    g.add_argument("--ray-runtime-env", default=None, metavar="JSON",
                   help="extra runtime_env for the workers (e.g. '{\"pip\": [...]}'); this checkout's disco package and "
                        "the DISCO_* / HF_* environment are always sent")


def config_from_args(args) -> ClusterConfig | None:
    if not getattr(args, "ray", None):
        return None
    if args.ray_threads < 1 or (args.ray_workers is not None and args.ray_workers < 1) or args.ray_gpus < 0:
        raise BenchError("--ray-threads and --ray-workers must be at least 1, --ray-gpus at least 0")
    extra = {}
    if args.ray_runtime_env:
        try:
            extra = json.loads(args.ray_runtime_env)
        except ValueError as exc:
            raise BenchError(f"--ray-runtime-env is not JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise BenchError("--ray-runtime-env must be a JSON object")
    return ClusterConfig(args.ray.strip(), args.ray_workers, args.ray_threads, args.ray_gpus, extra)
