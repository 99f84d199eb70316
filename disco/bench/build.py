"""A benchmark's table phase on this machine: every prompt's replay table built (or found in the cache, where the
Ray cluster may have put it), the prompts the length rule drops set aside, and one row per prompt of what happened
to it (``prompts.csv``: its tokens, whether it was cut or skipped and why, where its table was built and how long
that took)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from disco.bench.prompts import PromptEncoder, PromptSkipped
from disco.bench.runs import prepare_table
from disco.suites import SuitePrompt

PROMPT_COLUMNS = ["prompt_id", "question", "turn", "kind", "split", "chars", "prompt_tokens", "status", "cut_tokens",
                  "reason", "built_by", "reference_seconds", "chain_seconds", "chain_passes"]


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)


def build_here(pair, prompts: list[SuitePrompt], policies: list, max_new_tokens: int, cache_dir: Path,
               encoder: PromptEncoder, progress: bool = True) -> tuple[dict, list[SuitePrompt], list[dict]]:
    """(tables by prompt id, the prompts kept, one row per prompt). A table already in the cache costs only its
    replay check; the length rule's skips are rows with their reason."""
    tables, kept, rows = {}, [], []
    for p in _progress(prompts, len(prompts), "replay tables", progress):
        start = time.perf_counter()
        try:
            table, _ = prepare_table(pair, p, policies, max_new_tokens, cache_dir, encoder)
        except PromptSkipped:
            rows.append(prompt_row(p, encoder))
            continue
        tables[p.id] = table
        kept.append(p)
        stats = dict(table.stats)
        built = "here" if stats else "cache"
        rows.append(prompt_row(p, encoder, built_by=built, seconds=time.perf_counter() - start, **stats))
    return tables, kept, rows


def encode_all(prompts: list[SuitePrompt], encoder: PromptEncoder) -> tuple[list[SuitePrompt], list[dict]]:
    """The prompts the length rule keeps, and a row per prompt (timed-only runs, which build no tables)."""
    kept, rows = [], []
    for p in prompts:
        try:
            encoder.ids(p)
            kept.append(p)
        except PromptSkipped:
            pass
        rows.append(prompt_row(p, encoder))
    return kept, rows


def prompt_row(p: SuitePrompt, encoder: PromptEncoder, **extra) -> dict:
    encoded = encoder.encoded.get(p.id)
    skipped = encoder.skipped.get(p.id)
    status = "skipped" if skipped else ("cut" if encoded is not None and encoded.cut else "used")
    return {"prompt_id": p.id, "question": p.unit, "turn": p.turn, "kind": p.kind, "split": p.split,
            "chars": len(p.prompt), "prompt_tokens": len(encoded.ids) if encoded is not None else None,
            "status": status, "cut_tokens": encoded.cut if encoded is not None else 0, "reason": skipped or "",
            **extra}


def cached_rows(prompts: list[SuitePrompt], tables: dict) -> list[dict]:
    """Rows for prompts whose tables came from the cache (a re-costing run that loads no model: what the tables say)."""
    rows = []
    for p in prompts:
        about = tables[p.id].meta.get("prompt") or {}
        rows.append({"prompt_id": p.id, "question": p.unit, "turn": p.turn, "kind": p.kind, "split": p.split,
                     "chars": len(p.prompt), "prompt_tokens": len(tables[p.id].prompt_ids),
                     "status": "cut" if about.get("cut") else "used", "cut_tokens": about.get("cut", 0), "reason": "",
                     "built_by": "cache"})
    return rows


def merge_cluster_rows(rows: list[dict], cluster_rows: list[dict]) -> list[dict]:
    """Where the cluster built a prompt's table, its row says so (and how long the worker took)."""
    by_id = {r["prompt_id"]: r for r in cluster_rows}
    out = []
    for row in rows:
        remote = by_id.get(row["prompt_id"])
        if remote is not None and row.get("built_by") == "cache":
            row = {**row, "built_by": remote["built_by"],
                   **{k: remote.get(k) for k in ("reference_seconds", "chain_seconds", "chain_passes",
                                                 "unit_seconds", "round_trip_seconds")}}
        out.append(row)
    return out


def prompts_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in PROMPT_COLUMNS:
        if column not in frame:
            frame[column] = None
    return frame[PROMPT_COLUMNS + [c for c in frame.columns if c not in PROMPT_COLUMNS]]


def prompts_md(meta: dict) -> str:
    """The report's lines on the prompts (source, selection, the length rule's cuts and skips) and the tables (where
    they were built, how long it took)."""
    if "prompts_used" not in meta:  # a report of a run from before suites were counted
        return ""
    lines = ["## Prompts and tables", "", f"Suite: {meta['suite']}" + (f" ({'; '.join(meta['suite_notes'])})"
                                                                      if meta.get("suite_notes") else "")
             + f"; {meta.get('selection', '')}.  "]
    dropped = meta.get("rows_dropped") or []
    skipped = meta.get("prompts_skipped") or []
    lines.append(f"Prompts: {meta.get('prompts_used', 0)} used ({meta.get('prompts_cut', 0)} cut to fit), "
                 f"{len(skipped)} skipped, {len(dropped)} rows of the source unusable; {meta.get('fitting', '')}.  ")
    if skipped:
        lines.append("Skipped: " + "; ".join(f"`{s['id']}` ({s['reason']})" for s in skipped[:12])
                     + (f"; and {len(skipped) - 12} more (prompts.csv)" if len(skipped) > 12 else "") + ".  ")
    if dropped:
        reasons = pd.Series([d["reason"] for d in dropped]).value_counts()
        lines.append("Unusable rows: " + ", ".join(f"{n} {why}" for why, n in reasons.items()) + ".  ")
    if meta.get("tables_seconds") is not None:
        lines.append(f"Replay tables: {meta['tables_seconds']:.0f} s in this process (building what the cache did not "
                     "hold; prompts.csv has each prompt's time and where its table was built).  ")
    ray = meta.get("ray")
    if ray:
        lines.append(f"Ray ({ray['address']}): {ray['prompts_built']} prompts built by {ray['workers']} workers of "
                     f"{ray['threads']} CPUs in {ray['seconds']:.0f} s ({ray['startup_seconds']:.0f} s to start and "
                     f"load the pair), {ray['prompts_cached']} already cached; overhead per question (scheduling, "
                     f"shipping the tables, writing them) {ray['overhead_seconds_per_question_median']} s median.")
    return "\n".join(lines) + "\n"
