"""The Ray executor of the table phase (``disco.tables.cluster`` has the cluster's options and connection): a
``TableWorker`` per slot builds a question's tables with the sequential executor in a scratch folder and sends the
files back; the driver writes them into the one cache. The cache is the build's only result: the phase then reads
the tables from it (``OnRay.ensure``), and notes where each was built (``TablePhase.built``) for the rows."""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from disco import cache
from disco.errors import BenchError, UserError
from disco.replay.tables import pair_meta
from disco.tables.cluster import ClusterConfig, cause, connect, ray_module, slots
from disco.tables.identity import PairSpec
from disco.tables.lookup import cached_files, find_cached, holds_grid
from disco.tables.phase import Here, TablePhase, TableSet

ATTEMPTS = 3          # tries per question before the run stops with the last error


class TableWorker:
    """One slot of the cluster: the pair loaded once, tables built on request (wrapped by ``ray.remote``)."""

    def __init__(self, spec: PairSpec, threads: int):
        os.environ["DISCO_LLAMA_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)
        self.spec = spec
        self.pair = spec.load(log=lambda message: None)
        self.pair.warmup()

    def identity(self) -> dict:
        """What the tables this worker builds are keyed by (``disco.replay.tables.pair_meta``), and where it runs."""
        return {"pair": pair_meta(self.pair), "host": socket.gethostname(), "pid": os.getpid()}

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
            phase = TablePhase(self.spec, fitting, folder, max_new_tokens, Here(self.pair, progress=False))
            done = phase.ensure(unit, policies, costs, fill)
            prompts = {}
            for prompt in unit:
                table = done.tables.get(prompt.id)
                if table is None:
                    prompts[prompt.id] = {"skipped": phase.encoder.skipped[prompt.id]}
                    continue
                prompts[prompt.id] = {"file": table.path.name, "cut": phase.encoder.cut.get(prompt.id, 0),
                                      "prompt_tokens": len(table.prompt_ids), **table.stats}
            files = {p.name: p.read_text() for p in folder.glob("*.json") if before.get(p.name) != p.read_text()}
        return {"files": files, "prompts": prompts, "seconds": time.perf_counter() - start,
                "where": f"{socket.gethostname()}:{os.getpid()}"}


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
            errors.append(cause(exc))
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


def _units(prompts: list) -> list[list]:
    units: dict[str, list] = {}
    for p in prompts:
        units.setdefault(p.unit, []).append(p)
    return list(units.values())


@dataclass
class ClusterRun:
    """What a cluster build cost: prompts found cached and built, each question's overhead (its round trip less the
    worker's own time: scheduling, shipping the tables, writing them), workers and seconds."""

    cached: int = 0
    built: int = 0
    overheads: list[float] = field(default_factory=list)
    startup_seconds: float = 0.0
    seconds: float = 0.0
    workers: int = 0

    def summary(self) -> dict:
        return {"prompts_cached": self.cached, "prompts_built": self.built, "workers": self.workers,
                "startup_seconds": round(self.startup_seconds, 2), "seconds": round(self.seconds, 2),
                "overhead_seconds_per_question_median": (round(statistics.median(self.overheads), 3)
                                                         if self.overheads else None),
                "overhead_seconds_total": round(sum(self.overheads), 2)}


class OnRay:
    """The cluster executor: builds what the cache lacks on ``cfg``'s cluster, then reads every table from the
    cache (``TablePhase.cached``). ``run``: what the last build cost."""

    def __init__(self, cfg: ClusterConfig, progress: bool = True, log_line=print):
        self.cfg, self.progress, self.log_line = cfg, progress, log_line
        self.run: ClusterRun | None = None

    def ensure(self, phase: TablePhase, prompts: list, grid: list, costs: tuple, fill) -> TableSet:
        self.run = build_tables(self.cfg, phase, prompts, grid, costs, fill, self.progress, self.log_line)
        return phase.cached(prompts)

    def describe(self) -> dict:
        """The report's record of the cluster build (meta ``ray``)."""
        return {"address": self.cfg.address, "threads": self.cfg.threads, **(self.run or ClusterRun()).summary()}


def build_tables(cfg: ClusterConfig, phase: TablePhase, prompts: list, policies: list, costs: tuple = (), fill=None,
                 progress: bool = True, log_line=print) -> ClusterRun:
    """Build on the cluster every table of ``prompts`` the cache does not hold yet (``disco.tables.cluster``): the
    chain tokens ``policies`` need under a free assistant and each of ``costs`` (the run's own profile, where it is
    known without this machine's models), and what ``fill(table)`` reads (a picklable function, e.g. the
    classifier's samples); returns what it cost."""
    start = time.perf_counter()
    run = ClusterRun()
    todo = []
    for unit in _units(prompts):
        tables = [find_cached(phase.cache_dir, p, phase.spec, phase.max_new_tokens, phase.fitting) for p in unit]
        if all(t is not None and holds_grid(t, policies, phase.max_new_tokens, fill, costs) for t in tables):
            run.cached += len(unit)
        else:
            todo.append(unit)
    if not todo:
        log_line(f"ray: all {len(prompts)} prompts' tables are cached in {phase.cache_dir}; nothing to send")
        return run
    ray = ray_module()
    owned = not ray.is_initialized()
    connect(cfg)
    try:
        n = min(slots(ray, cfg), len(todo))
        actors, identity = start_workers(ray, cfg, phase.spec, n, log_line)
        run.workers, run.startup_seconds = len(actors), time.perf_counter() - start
        log_line(f"ray: {len(actors)} workers ({cfg.threads} CPUs{f', {cfg.gpus:g} GPUs' if cfg.gpus else ''} each) "
                 f"loaded {identity.get('models')} ({identity.get('engine')}) in {run.startup_seconds:.1f} s; "
                 f"{sum(map(len, todo))} prompts to build, {run.cached} cached")
        _drive(ray, cfg, phase, actors, identity, todo, (policies, fill, costs), run, progress, log_line,
               total=len(prompts))
    finally:
        if owned:
            ray.shutdown()
    run.seconds = time.perf_counter() - start
    return run


def _drive(ray, cfg, phase, actors, identity, todo, work, run, progress, log_line, total):
    """Keep every worker busy with one question at a time until all are built; a lost worker's question is sent again
    and the worker replaced (``ATTEMPTS`` tries per question). ``work``: what each build takes besides the question
    and the phase's run length and fitting (policies, fill, costs)."""
    from ray.exceptions import RayActorError, WorkerCrashedError

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=run.cached, desc="replay tables (ray)", file=sys.stderr, dynamic_ncols=True)
    pending = deque((unit, 1) for unit in todo)
    idle, inflight = list(actors), {}
    policies, fill, costs = work
    try:
        while pending or inflight:
            while idle and pending:
                actor = idle.pop()
                unit, attempt = pending.popleft()
                ref = actor.build.remote(unit, policies, phase.max_new_tokens, phase.fitting,
                                         cached_files(phase.cache_dir, unit), fill, costs)
                inflight[ref] = (actor, unit, attempt, time.perf_counter())
            if not inflight:
                raise BenchError("no Ray worker is left to build the tables")
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            actor, unit, attempt, sent = inflight.pop(ref)
            try:
                result = ray.get(ref)
            except (RayActorError, WorkerCrashedError) as exc:
                _lost(ray, cfg, phase.spec, unit, attempt, exc, pending, idle, log_line, identity)
                continue
            except Exception as exc:  # noqa: BLE001 - an error raised inside the worker's build
                if isinstance(exc, UserError) or attempt >= ATTEMPTS:
                    raise BenchError(f"{unit[0].unit}: {cause(exc)}") from None
                log_line(f"ray: {unit[0].unit} failed on a worker ({cause(exc)}); sending it again")
                pending.append((unit, attempt + 1))
                idle.append(actor)
                continue
            _store(phase, unit, result, time.perf_counter() - sent, run)
            idle.append(actor)
            if bar is not None:
                bar.update(len(unit))
    finally:
        if bar is not None:
            bar.close()


def _lost(ray, cfg, spec, unit, attempt, exc, pending, idle, log_line, expected: dict) -> None:
    """A worker died while building ``unit``: send the question again (to a replacement worker, if one starts)."""
    if attempt >= ATTEMPTS:
        raise BenchError(f"{unit[0].unit}: {ATTEMPTS} workers died building it ({cause(exc)})")
    log_line(f"ray: a worker died while building {unit[0].unit} ({cause(exc)[:120]}); sending it to another worker")
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


def _store(phase: TablePhase, unit: list, result: dict, round_trip: float, run: ClusterRun) -> None:
    """Write one question's files into the cache (each atomically, all of them or, on an error, the ones before it)
    and note in the phase where its prompts were built and how long it took."""
    for name, text in result["files"].items():
        cache.write_text(Path(phase.cache_dir) / Path(name).name, text)
    run.built += len(unit)
    run.overheads.append(round_trip - result["seconds"])
    for p in unit:
        info = {"unit_seconds": result["seconds"], "round_trip_seconds": round_trip, **result["prompts"].get(p.id, {})}
        phase.built[p.id] = {"built_by": f"ray:{result['where']}", **info}
