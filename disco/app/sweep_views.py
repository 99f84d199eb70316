"""What the Sweep tab shows of a sweep: its status line (the best of each kind of rule, the best cell to take away,
the length rule's cuts and skips), the best-settings and per-kind tables, the detail of one setting on one prompt,
and the CSV files behind its downloads."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import pandas as pd

from disco.app import plots
from disco.bench.analysis import REFERENCE_SETTING, best_settings
from disco.bench.kinds import kind_answer
from disco.costs import model as cost_mod
from disco.policies import AUTOREGRESSIVE, parse_strategy, policy_kinds
from disco.policies.export import take_away, take_away_md
from disco.policies.grids import CLASSIC_KINDS

KEEP_SWEEP_CSVS = 40  # sweep CSVs kept on disk for downloads (older ones are deleted; Gradio keeps its own copy)
RULE_CHOICES = [cls.kind for cls in policy_kinds() if cls.kind not in CLASSIC_KINDS]  # adaptive, entropy, ...
DETAIL_COLUMNS = ["iteration", "lookahead", "accepted", "emitted", "stop_reason", "min_confidence", "max_lookahead",
                  "draft_ms", "verify_ms", "new_tokens"]
SUMMARY_COLUMNS = ["strategy", "prompts", "speedup_geomean", "speedup_min", "speedup_max", "acceptance_rate_mean",
                   "mean_lookahead_mean"]


def csv_path() -> Path:
    """A fresh file for one sweep update's CSV in one folder, which keeps the newest KEEP_SWEEP_CSVS."""
    directory = Path(tempfile.gettempdir()) / "disco-sweep"
    directory.mkdir(parents=True, exist_ok=True)
    old = sorted(directory.glob("sweep-runs-*.csv"), key=lambda p: p.stat().st_mtime)
    for path in old[: max(0, len(old) - KEEP_SWEEP_CSVS + 1)]:
        path.unlink(missing_ok=True)
    return directory / f"sweep-runs-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns() % 1_000_000_000:09d}.csv"

def top_settings(summary: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    if summary is None or summary.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    rows = summary[(summary["mode"] == "replay") & (summary["kind"] == "all")]
    rows = rows.sort_values("speedup_geomean", ascending=False)
    keep = set(rows["strategy"].head(n)) | {AUTOREGRESSIVE, REFERENCE_SETTING}
    best = best_settings(summary)
    keep |= {v for k, v in best.items() if k.startswith("best_") and isinstance(v, str)}
    out = rows[rows["strategy"].isin(keep)][SUMMARY_COLUMNS].copy()
    for c in SUMMARY_COLUMNS[2:]:
        out[c] = out[c].astype(float).round(3)
    return out

def _profile_words(profile: str) -> str:
    if profile == cost_mod.MEASURED:
        return "per-pass costs measured on this machine"
    if profile.startswith("flat:"):
        return (f"cost profile `{profile}`: every target pass one step, every assistant pass {profile[5:]} of a "
                "step, as on a GPU with a tiny draft; iterations exact, costs hypothetical")
    return f"per-pass costs from the uploaded CSV `{Path(profile).name}`"

def status_line(summary: pd.DataFrame, done: int, total: int, seconds: float, profile: str = cost_mod.MEASURED) -> str:
    best = best_settings(summary)
    if not best:
        return f"{done}/{total} prompts replayed ({seconds:.0f} s)"
    fmt = lambda v: "—" if v is None or v != v else f"{v:.2f}x"  # noqa: E731
    return (f"**{done}/{total} prompts replayed** ({seconds:.0f} s). Best static: `{best.get('best_static')}` "
            f"{fmt(best.get('best_static_speedup'))} · `{REFERENCE_SETTING}` {fmt(best.get('reference_speedup'))} · "
            f"best threshold: `{best.get('best_threshold')}` {fmt(best.get('best_threshold_speedup'))} · "
            + "".join(f"best {kind}: `{best[f'best_{kind}']}` {fmt(best.get(f'best_{kind}_speedup'))} · "
                      for kind in RULE_CHOICES if best.get(f"best_{kind}"))
            + f"oracle {fmt(best.get('best_oracle_speedup'))}. Speed-ups are geometric means of estimated times "
            f"({_profile_words(profile)}).") + _take_away(best)

def _take_away(best: dict) -> str:
    """The grid's best cell (the oracle aside) as configuration for the engines people deploy with."""
    cells = {v: best.get(f"{k}_speedup", math.nan) for k, v in best.items()
             if k.startswith("best_") and not k.endswith("_speedup") and k != "best_oracle" and isinstance(v, str)}
    cells = {spec: value for spec, value in cells.items() if value == value}
    if not cells:
        return ""
    spec = max(cells, key=cells.get)
    block = take_away_md(take_away(parse_strategy(spec)))
    return (f"\n\n<details><summary>the best cell, `{spec}` ({cells[spec]:.2f}x), for transformers, llama.cpp and "
            f"vLLM</summary>\n\n{block}\n\n</details>")

KIND_COLUMNS = {"kind": "kind", "prompts": "prompts", "reference": REFERENCE_SETTING,
                "reference_of_best_threshold": "÷ best threshold", "reference_of_best_static": "÷ best static",
                "best_threshold": "best threshold", "best_threshold_speedup": "its speed-up",
                "best_static": "best static K", "best_static_speedup": "its speed-up ",
                "best_dynamic": "best dynamic rule", "dynamic_over_static": "dynamic ÷ static",
                "oracle_speedup": "oracle"}


def kinds_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The seed's question per kind (``disco.bench.kinds.kind_answer``), rounded for the page."""
    frame = kind_answer(runs) if runs is not None and not runs.empty else pd.DataFrame()
    if frame.empty:
        return pd.DataFrame(columns=list(KIND_COLUMNS.values()))
    frame = frame[list(KIND_COLUMNS)].rename(columns=KIND_COLUMNS)
    return frame.round(3)

def fit_words(update) -> str:
    """The length rule's doings, for the status line."""
    if not update.skipped and not update.cut:
        return ""
    parts = []
    if update.skipped:
        parts.append(f"{len(update.skipped)} prompt(s) skipped as too long ({', '.join(list(update.skipped)[:3])})")
    if update.cut:
        parts.append(f"{len(update.cut)} cut in the middle to fit")
    return " " + "; ".join(parts) + "."

def detail_view(frame: pd.DataFrame, spec: str, prompt_id: str):
    view = frame[DETAIL_COLUMNS].copy()
    for c in ("min_confidence", "draft_ms", "verify_ms"):
        view[c] = view[c].astype(float).round(3)
    if spec == AUTOREGRESSIVE:
        figure = plots.empty_figure(plots.LOOKAHEAD_TITLE, "autoregressive drafts nothing")
    else:
        figure = plots.lookahead_figure(frame, [spec])
    seconds = float(frame["elapsed_ms"].iloc[-1]) / 1000.0 if not frame.empty else math.nan
    figure.update_layout(title=dict(text=f"{spec} on {prompt_id}: {len(frame)} iterations, "
                                         f"{int(frame['new_tokens'].iloc[-1])} tokens, ~{seconds:.1f} s estimated"))
    return figure, view
