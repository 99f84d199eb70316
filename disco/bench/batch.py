"""The batch-size study: the seed's question (which K, which τ) at the batch sizes people serve, from batch-1 tables.

For every setting, batch size B and verification layout, the batched replay (``disco.replay.batched``) runs a long
request stream (the suite's prompts drawn with replacement, ``seeds`` shuffles) through B slots under continuous
batching and reads throughput and latency in its steady-state window; open-loop Poisson arrivals at a few rates run at
the largest B as the slot cap. Speed-up is throughput over the target alone's (``autoregressive``) on the same stream,
B and layout (at B = 1, in the ragged or padded-max layout and over the whole run, that is today's ratio of replay
time; the study reads a steady window of a resampled stream, so its B = 1 figure is close to it, not equal). Settings
are chosen on the train half of the prompts and
reported on the test half (``disco.suites.split_of``); ``disco.bench.batch_answer`` turns the rows into the answer.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from disco.costs.batched import DRAFTERS, BatchCosts, check_batch
from disco.errors import BenchError
from disco.machine import usable_cpus
from disco.policies.classic import STATIC_KS
from disco.replay.batched import BatchReplayError, Setting, goodput, metrics, request_stream, simulate, trace
from disco.replay.layouts import LAYOUTS, LayoutError, Pricer, check_context, check_layout
from disco.replay.tables import ReplayTable

BATCHES = (1, 2, 4, 8, 16, 32, 64)
RATES = ("0.5x", "0.8x", "0.95x")  # of the target alone's saturated request rate at the largest B
BATCH_TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
BASELINE = "autoregressive"
REFERENCE = "threshold:0.4:20"
CSV_COLUMNS = ["strategy", "kind", "batch", "layout", "context", "arrival", "cost_profile", "split", "tokens_per_s", "speedup",
               "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "goodput_rps",
               "mean_active", "draft_share", "window_ms", "steady", "requests", "label", "cut_share"]


def default_settings(static_ks: Sequence[int] = STATIC_KS, taus: Sequence[float] = BATCH_TAUS,
                     kmax: int = 20) -> list[str]:
    """The batch study's grid: the target alone, static K, thresholds at KMAX, SGLang's shared depth, the
    batch-level stop, and the reference threshold drafting for free to the batch's depth (disco.replay.free_draft)."""
    return ([BASELINE] + [f"static:{k}" for k in static_ks] + [f"threshold:{t:g}:{kmax}" for t in taus]
            + ["sglang:3", f"batchstop:{kmax}", f"free:{REFERENCE}"])


def parse_rates(values: Sequence[str] | None) -> list[tuple[str, float, bool]]:
    """(label, value, relative?) of each arrival rate: ``2.5`` requests/s, or ``0.8x`` of the saturated rate."""
    out = []
    for text in values or ():
        text = str(text).strip()
        relative = text.endswith("x")
        try:
            value = float(text[:-1] if relative else text)
        except ValueError:
            raise BenchError(f"arrival rate {text!r}: expected requests/s (e.g. 2.5) or a share of the saturated "
                             "rate (e.g. 0.8x)") from None
        if not (math.isfinite(value) and value > 0):
            raise BenchError(f"arrival rate {text!r} must be > 0")
        out.append((text, value, relative))
    return out


@dataclass
class BatchStudy:
    """What the study runs (checked once, here)."""

    batches: tuple[int, ...] = BATCHES
    layouts: tuple[str, ...] = LAYOUTS
    rates: tuple[str, ...] = RATES
    settings: tuple[str, ...] = field(default_factory=lambda: tuple(default_settings()))
    requests: int = 0           # per stream; 0: max(48, 6 x B)
    seeds: int = 3
    slo_factor: float = 2.0     # latency target: TPOT and TTFT within this factor of the target alone's at B = 1
    band: bool = True           # a roofline profile: also answer under every model of its uncertainty band
    drafter: str = "assistant"  # or "head": a drafter that costs one target layer per token (a what-if)
    contexts: tuple[int, ...] = (0,)  # tokens each sequence holds cached before its prompt (disco.replay.layouts.Pricer)

    def __post_init__(self):
        if not self.batches:
            raise BenchError("give at least one batch size, e.g. --batch 1,2,4,8")
        try:
            self.batches = tuple(sorted({check_batch(b) for b in self.batches}))
        except ValueError as exc:
            raise BenchError(str(exc)) from None
        self.layouts = tuple(check_layout(x) for x in self.layouts)
        try:
            self.contexts = tuple(sorted({check_context(c) for c in self.contexts})) or (0,)
        except LayoutError as exc:
            raise BenchError(f"--batch-contexts: {exc}") from None
        if self.drafter not in DRAFTERS:
            raise BenchError(f"unknown drafter {self.drafter!r}: expected {' or '.join(DRAFTERS)}")
        parse_rates(self.rates)
        if self.seeds < 1:
            raise BenchError("--batch-seeds must be >= 1")
        try:
            parsed = [Setting(s) for s in self.settings]
        except BatchReplayError as exc:
            raise BenchError(str(exc)) from None
        specs = [s.spec for s in parsed]
        self.settings = tuple(dict.fromkeys([BASELINE] + specs))

    def count(self, batch: int) -> int:
        return self.requests or max(48, 6 * batch)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _kind(spec: str) -> str:
    return spec.split(":", 1)[0].split("@", 1)[0]


def _one(spec: str, tables: list[ReplayTable], batch: int, pricer: Pricer, study: BatchStudy, max_new: int,
         rate: float | None = None, traces: dict | None = None) -> dict:
    """One (setting, B, layout, arrival) point: metrics averaged over the study's seeded streams."""
    runs = []
    for seed in range(study.seeds):
        stream = request_stream(tables, study.count(batch), seed, rate)
        m = metrics(simulate(spec, stream, batch, pricer, max_new, traces=traces), open_loop=rate is not None)
        runs.append(m)
    out = {k: float(np.mean([r[k] for r in runs])) for k in runs[0] if not k.startswith("_") and k != "steady"}
    out["steady"] = all(r["steady"] for r in runs)
    out["_runs"] = runs
    return out


def run_study(tables_by_split: dict[str, list[ReplayTable]], costs: BatchCosts, profile: str, study: BatchStudy,
              max_new_tokens: int, progress: bool = True, workers: int | None = None) -> pd.DataFrame:
    """Every (split, setting, B, layout, context) at fixed concurrency and every (split, setting, rate, layout,
    context) at the largest B: one row each (``CSV_COLUMNS``). Each (split, layout, context) is a job of its own, run on ``workers`` processes (default:
    the cores this process may use; ``DISCO_BATCH_WORKERS``; one where a table still holds its models), forked after
    the rules that read no costs have been replayed once per table (``disco.replay.batched.trace``), so every job
    shares those iterations; rows come back in job order, so the frame is the same whatever the number of workers."""
    started = time.perf_counter()
    jobs = [(split, layout, context) for split, tables in tables_by_split.items() if tables
            for layout in study.layouts for context in study.contexts]
    workers = min(len(jobs), _workers(workers)) if jobs else 1
    if any(t.builder is not None for tables in tables_by_split.values() for t in tables):
        workers = 1  # tables that may still run their models (a chain extended): never in a forked child
    rows: list[dict] = []
    pool = None
    try:
        traces = {split: _warm(tables, study, max_new_tokens) for split, tables in tables_by_split.items() if tables}
        _SHARED.update(tables=tables_by_split, costs=costs, study=study, max_new=max_new_tokens, traces=traces)
        if workers <= 1:
            results = map(_job, jobs)
        else:
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
            results = pool.map(_job, jobs)
        for (split, layout, context), job_rows in zip(jobs, results):
            rows += job_rows
            if progress:
                at = f" at context {context}" if len(study.contexts) > 1 else ""
                _log(f"batch: {split} {layout}{at} done ({time.perf_counter() - started:.0f} s)")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        _SHARED.clear()
    frame = pd.DataFrame(rows)
    frame["cost_profile"] = profile
    frame["label"] = costs.label
    return frame[[c for c in CSV_COLUMNS if c in frame.columns]]


_SHARED: dict = {}  # the study's inputs, set before the workers fork (they read it; nothing is pickled but the rows)


def _workers(asked: int | None) -> int:
    if asked is not None:
        return max(1, int(asked))
    env = os.environ.get("DISCO_BATCH_WORKERS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise BenchError(f"DISCO_BATCH_WORKERS={env!r}: give a whole number of processes") from None
    return usable_cpus()


def _warm(tables: list[ReplayTable], study: BatchStudy, max_new: int) -> dict:
    """Each cost-free per-sequence rule replayed once per table, before the jobs fork."""
    traces: dict = {}
    for spec in study.settings:
        setting = Setting(spec)
        if setting.cacheable:
            for table in tables:
                trace(table, setting, max_new, traces)
    return traces


def _job(job: tuple[str, str, int]) -> list[dict]:
    """One (split, layout, context): every B at fixed concurrency, then every arrival rate at the largest B."""
    split, layout, context = job
    tables, study, max_new = _SHARED["tables"][split], _SHARED["study"], _SHARED["max_new"]
    traces = _SHARED["traces"][split]
    pricer = Pricer(_SHARED["costs"], layout, context)
    slo = _slo(tables, pricer, study, max_new, traces)
    rows: list[dict] = []
    for batch in study.batches:
        rows += _points(tables, pricer, study, max_new, batch, None, "closed", slo,
                        dict(split=split, layout=layout, context=context, batch=batch), traces)
    cap = study.batches[-1]
    if study.rates:
        base = _one(BASELINE, tables, cap, pricer, study, max_new, traces=traces)
        mean_tokens = np.mean([len(t.reference_for(max_new)) for t in tables])
        saturated = base["tokens_per_s"] / max(mean_tokens, 1e-9)
        for label, value, relative in parse_rates(study.rates):
            rate = value * saturated if relative else value
            rows += _points(tables, pricer, study, max_new, cap, rate, label, slo,
                            dict(split=split, layout=layout, context=context, batch=cap), traces)
    return rows


def _slo(tables, pricer: Pricer, study: BatchStudy, max_new: int, traces=None) -> tuple[float, float]:
    """(TTFT, TPOT) targets: ``slo_factor`` times the target alone's p50 at batch 1 on the same stream."""
    base = _one(BASELINE, tables, 1, pricer, study, max_new, traces=traces)
    return study.slo_factor * base["ttft_ms_p50"], study.slo_factor * base["tpot_ms_p50"]


def _points(tables, pricer, study, max_new, batch, rate, arrival, slo, keys, traces=None) -> list[dict]:
    base = None
    out = []
    for spec in study.settings:
        m = _one(spec, tables, batch, pricer, study, max_new, rate, traces)
        if spec == BASELINE:
            base = m
        good = float(np.mean([goodput(r, r["window_ms"], *slo) for r in m["_runs"]]))
        out.append({**keys, "strategy": spec, "kind": _kind(spec), "arrival": arrival,
                    "tokens_per_s": m["tokens_per_s"],
                    "speedup": m["tokens_per_s"] / base["tokens_per_s"] if base else math.nan,
                    **{k: m[k] for k in ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
                                         "itl_ms_p99", "mean_active", "draft_share", "window_ms", "steady",
                                         "cut_share")},
                    "goodput_rps": good, "requests": study.count(batch) * study.seeds})
    return out
