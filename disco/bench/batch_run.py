"""``python -m disco bench --batch ...``: the batch-size study on a suite's replay tables, models loaded only when a
table is missing (then the ordinary bench builds them first, under the same options).

Writes ``batch.csv`` (one row per split, setting, B or rate, layout), ``batch_answer.csv`` (the answer per layout and
B), ``batch_schedules.json`` and ``batch.md`` to the run's output folder."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pandas as pd

from disco import cache
from disco.bench.batch import BatchStudy, run_study
from disco.bench.batch_answer import (answer, band_markdown, band_table, heatmaps, markdown, schedules_by_context,
                                      to_json)
from disco.costs import model as cost_model
from disco.costs import profile as profiles
from disco.costs import roofline_fit
from disco.costs.batched import context_note, resolve_batched, with_drafter
from disco.decode import acceptance
from disco.decode.trace import iterations_frame
from disco.policies import parse_strategy
from disco.replay.run import replay
from disco.errors import BenchError
from disco.suites import pick, split_of, split_prompts
from disco.tables.lookup import find_cached


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tables(cfg, prompts):
    """Each prompt's cached table (None where there is none), found without any model (``disco.tables.lookup``)."""
    cache_dir = cfg.cache_dir or cache.tables_dir()
    return {p.id: find_cached(cache_dir, p, cfg.pair_spec(), cfg.max_new_tokens, cfg.fitting) for p in prompts}


def _measured(tables: dict, cfg):
    """This machine's batch-1 cost model for the tables' engine (the measured profile), or None."""
    meta = next(iter(tables.values())).meta
    prof = profiles.latest_for(cfg.models, str(meta.get("engine", "torch")))
    return prof.cost_model_near(meta.get("assistant_precision")) if prof is not None and prof.precisions else None


def _band(profile: str, by_split: dict, study: BatchStudy, cfg) -> "pd.DataFrame":
    """The answer under every model of the roofline's band (closed loop, one seed each; ``disco.costs.roofline``)."""
    quick = dataclasses.replace(study, rates=(), seeds=1)  # the nominal model too: a flip is the band's, not a seed's
    answers = {}
    for model in roofline_fit.band(profile):
        _log(f"batch: band model {model.note or 'nominal'} ...")
        model = with_drafter(model, study.drafter)
        answers[model.note or "nominal"] = answer(run_study(by_split, model, profile, quick, cfg.max_new_tokens, False))
    return band_table(answers)


def synthetic_acceptance(ans, by_split: dict, max_new_tokens: int) -> dict:
    """For each static K the answer chose (any B, any layout): this pair's per-position unconditional acceptance on the
    report split's prompts, as vLLM's ``speculative_config`` takes it to benchmark a deployment with this pair's
    acceptance (``disco.decode.acceptance.vllm_speculative_config``)."""
    tables = by_split.get("test") or next(iter(by_split.values()))
    out = {}
    for k in sorted({int(s.split(":")[1]) for s in ans["best_static"] if isinstance(s, str)}):
        records = [r for t in tables for r in replay(t, parse_strategy(f"static:{k}"), max_new_tokens).records]
        out[str(k)] = acceptance.vllm_speculative_config(iterations_frame(records), k)
    return out


def run_batch_bench(cfg, study: BatchStudy, run_bench) -> dict:
    """The study on ``cfg``'s suite: tables found in the cache (or built by ``run_bench(cfg)``), then replayed in batches
    under ``cfg.cost_profile``. Returns the files written and the answer."""
    prompts = split_prompts(pick(cfg.selection).prompts, cfg.split)
    tables = _tables(cfg, prompts)
    if any(t is None for t in tables.values()):
        _log(f"batch: {sum(t is None for t in tables.values())} of {len(tables)} prompts have no cached replay table; "
             "running the bench first to build them")
        run_bench(cfg)
        tables = _tables(cfg, prompts)
        if any(t is None for t in tables.values()):
            missing = [i for i, t in tables.items() if t is None]
            raise BenchError(f"no replay table for {', '.join(missing[:5])} after the bench (skipped prompts?); "
                             "drop them with --prompts")
    profile = cost_model.check_profile(cfg.cost_profile)
    costs = with_drafter(resolve_batched(profile, measured=_measured(tables, cfg) if profile == cost_model.MEASURED
                                         else None), study.drafter)
    splits = split_of(prompts)
    by_split = {s: [tables[p.id] for p in prompts if splits[p.id] == s] for s in ("train", "test")}
    if not by_split["train"] or not by_split["test"]:
        by_split = {"all": list(tables.values())}
        _log("batch: fewer than two prompts per split; choosing and reporting on the same prompts")
    note = context_note(costs, study.contexts) if study.contexts != (0,) else None
    if note:
        _log(f"batch: --batch-contexts: {note}")
    start = time.perf_counter()
    rows = run_study(by_split, costs, profile, study, cfg.max_new_tokens, cfg.progress)
    ans = answer(rows)
    acceptance = synthetic_acceptance(ans, by_split, cfg.max_new_tokens)
    band = _band(profile, by_split, study, cfg) if profile.startswith("roofline:") and study.band else None
    files = write_batch_reports(Path(cfg.out), rows, ans, costs.label, cfg.command, acceptance, band)
    _log(f"batch: {len(rows)} points in {time.perf_counter() - start:.1f} s under {costs.label} (models not loaded)")
    return {"files": files, "answer": ans, "rows": rows}


def write_batch_reports(out: Path, rows, ans, label: str, command: str, acceptance: dict, band=None) -> dict:
    """The study's files in ``out`` (module docstring) from its rows and answer; ``band``: the roofline band's table."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"batch": out / "batch.csv", "answer": out / "batch_answer.csv", "schedules": out / "batch_schedules.json",
             "markdown": out / "batch.md", "heatmaps": out / "batch_heatmaps.html"}
    rows.to_csv(files["batch"], index=False)
    ans.to_csv(files["answer"], index=False)
    takeaway = {layout: schedules_by_context(ans, layout) for layout in ans["layout"].unique()}
    takeaway["vllm_synthetic_acceptance"] = acceptance
    files["schedules"].write_text(to_json(takeaway) + "\n")
    text = markdown(rows, ans, label, command)
    heatmaps(rows, label).write_html(files["heatmaps"], include_plotlyjs="directory")
    if band is not None:
        files["band"] = out / "batch_band.csv"
        band.to_csv(files["band"], index=False)
        text += "\n" + band_markdown(band, label)
    files["markdown"].write_text(text)
    return files


def rewrite_batch_reports(out: Path) -> dict:
    """``bench --report-only`` on a batch study's folder: its answer, schedules, markdown and heatmaps rebuilt from its
    ``batch.csv`` (and ``batch_band.csv``; the command kept from ``batch.md`` and the synthetic acceptance from
    ``batch_schedules.json`` where they are there); no table or model is read."""
    try:
        rows = pd.read_csv(out / "batch.csv")
        missing = [c for c in ("strategy", "kind", "batch", "layout", "arrival", "split", "speedup") if c not in rows]
        if missing or rows.empty:
            raise ValueError(f"not a batch study's rows (no {', '.join(missing) or 'rows'})")
        ans = answer(rows)
        band = pd.read_csv(out / "batch_band.csv") if (out / "batch_band.csv").exists() else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"--report-only: {out / 'batch.csv'}: {exc}") from None
    command, acceptance = "", {}
    try:
        command = next((line.split("`")[1] for line in (out / "batch.md").read_text().splitlines()
                        if line.startswith("Command: `")), "")
        kept = json.loads((out / "batch_schedules.json").read_text())
        acceptance = kept.get("vllm_synthetic_acceptance", {}) if isinstance(kept, dict) else {}
    except (OSError, ValueError, IndexError) as exc:
        _log(f"batch: --report-only: {exc}; the command or the synthetic acceptance is left out")
    label = str(rows["label"].iloc[0]) if "label" in rows.columns else "?"
    return write_batch_reports(out, rows, ans, label, command, acceptance, band)
