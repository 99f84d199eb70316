"""Replay tables built on a Ray cluster (``--ray ADDRESS``, or ``--ray local`` to start Ray on this machine).

A table is a pure function of (pair, prompt, run length, the grid whose chains it must hold), and building it is
the expensive part of every benchmark. So the driver (the command the user runs) sends the prompts whose tables are
not cached yet to ``TableWorker`` actors, one per slot (``--ray-threads`` CPUs each, or ``--ray-gpus`` GPUs), each
loading the pair once; a worker builds a question's tables (a multi-turn question's turns in order, on one worker)
in a scratch folder with the same code as a sequential build (``disco.bench.runs.prepare_table``) and sends the files
back; the driver writes them into the one cache atomically. Then the command goes on exactly as without Ray: every
table is found in the cache.

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
retry of a lost question.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import disco
from disco import cache
from disco.bench.cached import find_cached, holds_grid
from disco.bench.prompts import PromptEncoder, PromptSkipped
from disco.bench.runs import prepare_table
from disco.errors import BenchError, UserError, first_line
from disco.models import load_resolved
from disco.replay.tables import MACHINE_KEYS, cached_table_paths

ATTEMPTS = 3          # tries per question before the run stops with the last error
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


@dataclass(frozen=True)
class PairSpec:
    """What each worker loads (the command's own model options)."""

    models: str
    engine: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    assistant_precision: str = "auto"


def ray_module():
    try:
        import ray
    except ImportError:
        raise BenchError("--ray needs Ray: pip install -r requirements-ray.txt") from None
    return ray


class TableWorker:
    """One slot of the cluster: the pair loaded once, tables built on request (wrapped by ``ray.remote``)."""

    def __init__(self, spec: PairSpec, threads: int):
        os.environ["DISCO_LLAMA_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)
        self.pair = load_resolved(spec.models, spec.dtype, spec.device, spec.assistant_precision,
                                  log=lambda message: None, engine=spec.engine)
        self.pair.warmup()

    def identity(self) -> dict:
        """What the tables this worker builds are keyed by (``disco.replay.tables`` meta), and where it runs."""
        info = {k: v for k, v in self.pair.describe().items() if k not in MACHINE_KEYS}
        return {"pair": info, "host": socket.gethostname(), "pid": os.getpid()}

    def build(self, unit: list, policies: list, max_new_tokens: int, fitting, existing: dict[str, str],
              fill=None, costs: tuple = ()) -> dict:
        """The tables of one question (its prompts in order), built in a scratch folder that starts with the cached
        tables sent along (``existing``: file name -> text). Returns every file written and, per prompt, its build
        stats or why it was skipped."""
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="disco-ray-") as scratch:
            folder = Path(scratch)
            for name, text in existing.items():
                (folder / Path(name).name).write_text(text)
            before = {p.name: p.read_text() for p in folder.glob("*.json")}
            encoder = PromptEncoder(self.pair, max_new_tokens, folder, fitting)
            prompts = {}
            for prompt in unit:
                try:
                    table, _ = prepare_table(self.pair, prompt, policies, max_new_tokens, folder, encoder, fill,
                                             costs)
                except PromptSkipped:
                    prompts[prompt.id] = {"skipped": encoder.skipped[prompt.id]}
                    continue
                prompts[prompt.id] = {"file": table.path.name, "cut": encoder.cut.get(prompt.id, 0),
                                      "prompt_tokens": len(table.prompt_ids), **table.stats}
            files = {p.name: p.read_text() for p in folder.glob("*.json") if before.get(p.name) != p.read_text()}
        return {"files": files, "prompts": prompts, "seconds": time.perf_counter() - start,
                "where": f"{socket.gethostname()}:{os.getpid()}"}


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
                     num_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
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


def start_workers(ray, cfg: ClusterConfig, spec: PairSpec, n: int, log_line=print) -> tuple[list, dict]:
    """``n`` workers that loaded the pair, and the identity they share; the ones that could not load it are named."""
    remote = ray.remote(num_cpus=cfg.threads, num_gpus=cfg.gpus or 0, max_restarts=0)(TableWorker)
    actors = [remote.remote(spec, cfg.threads) for _ in range(n)]
    ready, identities, errors = [], [], []
    for actor in actors:
        try:
            identities.append(ray.get(actor.identity.remote()))
            ready.append(actor)
        except Exception as exc:  # noqa: BLE001 - the worker's load error, wrapped by Ray
            errors.append(_cause(exc))
    for error in errors:
        log_line(f"a Ray worker could not load {spec.models}: {error}")
    if not ready:
        raise BenchError(f"no Ray worker could load {spec.models}: {errors[0] if errors else 'no worker started'}")
    pairs = {json.dumps(i["pair"], sort_keys=True) for i in identities}
    if len(pairs) > 1:
        raise BenchError("the Ray workers load different pairs (engine, dtype, assistant precision or llama.cpp's CPU "
                         "variant differ between machines): give --engine, --dtype and --assistant-precision "
                         "explicitly, and on mixed CPUs set DISCO_LLAMA_CPU_VARIANT (e.g. haswell) where you run bench")
    return ready, identities[0]["pair"]


def _cause(exc: BaseException) -> str:
    """The user-facing line inside a Ray error (the worker's own exception where Ray kept it)."""
    cause = getattr(exc, "cause", None) or getattr(exc, "__cause__", None)
    inner = cause if isinstance(cause, BaseException) else exc
    if isinstance(inner, UserError):
        return first_line(inner)
    text = str(inner)
    for line in text.splitlines():  # Ray's wrapper puts the worker's "Type: message" on a line of its own
        if ("Error" in line or "Exception" in line) and ":" in line and not line.startswith(("Traceback", "  ")):
            return line.strip()[:300]
    return first_line(inner)[:300]


def _units(prompts: list) -> list[list]:
    units: dict[str, list] = {}
    for p in prompts:
        units.setdefault(p.unit, []).append(p)
    return list(units.values())


def _existing(cache_dir: Path, unit: list) -> dict[str, str]:
    """The cached files of a question's tables (its earlier turns' too), sent along to be extended."""
    names = {q.id for p in unit for q in [*p.earlier_turns(), p]}
    return {path.name: path.read_text() for name in names for path in cached_table_paths(cache_dir, name)}


@dataclass
class ClusterRun:
    """What a cluster build did: per prompt, where and how long (``rows``), and the run's overheads."""

    rows: list[dict] = field(default_factory=list)
    cached: int = 0
    startup_seconds: float = 0.0
    seconds: float = 0.0
    workers: int = 0

    def summary(self) -> dict:
        built = [r for r in self.rows if "round_trip_seconds" in r]
        per_unit = {}
        for r in built:
            per_unit.setdefault(r["unit"], r)
        overhead = [u["round_trip_seconds"] - u["unit_seconds"] for u in per_unit.values()]
        return {"prompts_cached": self.cached, "prompts_built": len(built), "workers": self.workers,
                "startup_seconds": round(self.startup_seconds, 2), "seconds": round(self.seconds, 2),
                "overhead_seconds_per_question_median": round(statistics.median(overhead), 3) if overhead else None,
                "overhead_seconds_total": round(sum(overhead), 2)}


def build_tables(cfg: ClusterConfig, spec: PairSpec, prompts: list, policies: list, max_new_tokens: int, fitting,
                 cache_dir: Path, progress: bool = True, log_line=print, fill=None, costs: tuple = ()) -> ClusterRun:
    """Build on the cluster every table of ``prompts`` the cache does not hold yet (module doc): the chain tokens
    ``policies`` need under a free assistant and each of ``costs`` (the run's own profile, where it is known without
    this machine's models), and what ``fill(table)`` reads (a picklable function, e.g. the classifier's samples);
    returns what it did."""
    start = time.perf_counter()
    run = ClusterRun()
    want = {"models": spec.models, "engine": spec.engine, "dtype": spec.dtype,
            "assistant_precision": spec.assistant_precision}
    todo = []
    for unit in _units(prompts):
        tables = [find_cached(cache_dir, p, want, max_new_tokens, fitting) for p in unit]
        if all(t is not None and holds_grid(t, policies, max_new_tokens, fill, costs) for t in tables):
            run.cached += len(unit)
        else:
            todo.append(unit)
    if not todo:
        log_line(f"ray: all {len(prompts)} prompts' tables are cached in {cache_dir}; nothing to send")
        return run
    ray = ray_module()
    owned = not ray.is_initialized()
    connect(cfg)
    try:
        n = min(slots(ray, cfg), len(todo))
        actors, identity = start_workers(ray, cfg, spec, n, log_line)
        run.workers, run.startup_seconds = len(actors), time.perf_counter() - start
        log_line(f"ray: {len(actors)} workers ({cfg.threads} CPUs{f', {cfg.gpus:g} GPUs' if cfg.gpus else ''} each) "
                 f"loaded {identity.get('models')} ({identity.get('engine')}) in {run.startup_seconds:.1f} s; "
                 f"{sum(map(len, todo))} prompts to build, {run.cached} cached")
        _drive(ray, cfg, spec, actors, identity, todo, (policies, max_new_tokens, fitting, fill, costs), cache_dir,
               run, progress, log_line, total=len(prompts))
    finally:
        if owned:
            ray.shutdown()
    run.seconds = time.perf_counter() - start
    return run


def _drive(ray, cfg, spec, actors, identity, todo, work, cache_dir, run, progress, log_line, total):
    """Keep every worker busy with one question at a time until all are built; a lost worker's question is sent again
    and the worker replaced (``ATTEMPTS`` tries per question). ``work``: what each build takes besides the question
    (policies, run length, fitting, fill, costs)."""
    from ray.exceptions import RayActorError, WorkerCrashedError

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=run.cached, desc="replay tables (ray)", file=sys.stderr, dynamic_ncols=True)
    pending = deque((unit, 1) for unit in todo)
    idle, inflight = list(actors), {}
    try:
        while pending or inflight:
            while idle and pending:
                actor = idle.pop()
                unit, attempt = pending.popleft()
                policies, max_new_tokens, fitting, fill, costs = work
                ref = actor.build.remote(unit, policies, max_new_tokens, fitting, _existing(cache_dir, unit), fill,
                                         costs)
                inflight[ref] = (actor, unit, attempt, time.perf_counter())
            if not inflight:
                raise BenchError("no Ray worker is left to build the tables")
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            actor, unit, attempt, sent = inflight.pop(ref)
            try:
                result = ray.get(ref)
            except (RayActorError, WorkerCrashedError) as exc:
                _lost(ray, cfg, spec, unit, attempt, exc, pending, idle, log_line, identity)
                continue
            except Exception as exc:  # noqa: BLE001 - an error raised inside the worker's build
                if isinstance(exc, UserError) or attempt >= ATTEMPTS:
                    raise BenchError(f"{unit[0].unit}: {_cause(exc)}") from None
                log_line(f"ray: {unit[0].unit} failed on a worker ({_cause(exc)}); sending it again")
                pending.append((unit, attempt + 1))
                idle.append(actor)
                continue
            _store(cache_dir, unit, result, time.perf_counter() - sent, run)
            idle.append(actor)
            if bar is not None:
                bar.update(len(unit))
    finally:
        if bar is not None:
            bar.close()


def _lost(ray, cfg, spec, unit, attempt, exc, pending, idle, log_line, expected: dict) -> None:
    """A worker died while building ``unit``: send the question again (to a replacement worker, if one starts)."""
    if attempt >= ATTEMPTS:
        raise BenchError(f"{unit[0].unit}: {ATTEMPTS} workers died building it ({_cause(exc)})")
    log_line(f"ray: a worker died while building {unit[0].unit} ({_cause(exc)[:120]}); sending it to another worker")
    pending.appendleft((unit, attempt + 1))
    try:
        replacement, identity = start_workers(ray, cfg, spec, 1, log_line)
    except BenchError as error:
        log_line(f"ray: no replacement worker: {error}")
        return
    if identity != expected:  # a node of another kind: its tables would not be the others' bytes
        log_line("ray: the replacement worker loads another pair (engine, dtype or assistant precision); not used")
        return
    idle.extend(replacement)


def _store(cache_dir: Path, unit: list, result: dict, round_trip: float, run: ClusterRun) -> None:
    """Write one question's files into the cache (each atomically, all of them or, on an error, the ones before it)
    and record its prompts."""
    for name, text in result["files"].items():
        cache.write_text(Path(cache_dir) / Path(name).name, text)
    where = f"ray:{result['where']}"
    for p in unit:
        info = result["prompts"].get(p.id, {})
        run.rows.append({"prompt_id": p.id, "unit": p.unit, "kind": p.kind, "split": p.split, "built_by": where,
                         "unit_seconds": result["seconds"], "round_trip_seconds": round_trip,
                         **{k: v for k, v in info.items() if k != "file"}})


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
