"""The benchmark's report files (summary.md, CSVs, heatmaps, meta.json), from the runs table and the meta alone.

The report is a list of sections (``SECTIONS``): each has a name (its key in the files written), the frame it reports
(computed once from the runs), the CSV that frame goes to and the function that words it in summary.md
(``disco.bench.report_md`` and the studies' own modules). One loop writes them in order: a section with a frame only
when the frame holds rows, one without when it has something to say."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

from disco.bench import report_md as md
from disco.bench.analysis import (
    REFERENCE_SETTING, add_decode_speedup, best_settings, engine_frame, peer_frame, quiet_outcome, summarize_runs,
    theory_frame, validation_frame, validation_outcome,
)
from disco.bench.drafters import drafter_answer, drafter_answer_md, paired, paired_md
from disco.bench.heatmap import heatmap_figure, heatmap_svg
from disco.bench.holdout import best_new, holdout_frame, holdout_md, kind_holdout, kind_holdout_md
from disco.bench.kinds import kind_answer, kind_answer_md, leave_one_kind_out, leave_one_kind_out_md
from disco.bench.online import regret_frame, regret_md
from disco.bench.positions import positions_frame, positions_md
from disco.bench.runs import ensure_policy_columns
from disco.costs.model import CostModel
from disco.errors import BenchError, first_line
from disco.policies import AUTOREGRESSIVE

log = logging.getLogger(__name__)


@dataclass
class Report:
    """What every section reads: the output folder, the run's meta, the runs table and what is computed from it once
    (``drafts``: this run's drafting iterations, None to keep the positions.csv the run wrote)."""

    out: Path
    meta: dict
    runs: pd.DataFrame
    theory: pd.DataFrame | None
    drafts: pd.DataFrame | None

    @cached_property
    def modes(self) -> set:
        return set(self.runs["mode"]) if not self.runs.empty else set()

    @cached_property
    def summary(self) -> pd.DataFrame:
        return summarize_runs(self.runs)

    @cached_property
    def val(self) -> pd.DataFrame:
        return validation_frame(self.runs) if {"replay", "timed"} <= self.modes else pd.DataFrame()

    @cached_property
    def validation(self) -> dict:
        return validation_outcome(self.val)

    @cached_property
    def peers(self) -> pd.DataFrame:
        return peer_frame(self.summary, self.runs) if "timed" in self.modes else pd.DataFrame()

    @cached_property
    def engines(self) -> pd.DataFrame:
        return engine_frame(self.runs) if "timed" in self.modes else pd.DataFrame()


@dataclass(frozen=True)
class Section:
    name: str | None                                  # its key in the files written (None: words alone)
    frame: Callable[[Report], pd.DataFrame | None] | None  # what it reports (None: words alone)
    csv: str | None                                   # where the frame goes
    markdown: Callable[[Report, pd.DataFrame | None], str]


def _positions(r: Report) -> pd.DataFrame:
    """This run's drafts by position (none in a timed-only run: never an earlier run's file), or with ``--report-only``
    the positions the run wrote."""
    if r.drafts is not None:
        positions = positions_frame(r.drafts) if not r.drafts.empty else pd.DataFrame()
        if positions.empty:
            (r.out / "positions.csv").unlink(missing_ok=True)
        return positions
    return pd.read_csv(r.out / "positions.csv") if (r.out / "positions.csv").is_file() else pd.DataFrame()


def _positions_md(r: Report, positions: pd.DataFrame) -> str:
    shown = [s for s in r.meta.get("timed_strategies") or _headline_specs(r.meta.get("best", {})) if s != AUTOREGRESSIVE]
    return positions_md(positions, shown, ("all", "copy") if "copy" in set(positions["kind"]) else ("all",))


def _holdout_md(r: Report, held: pd.DataFrame) -> str:
    r.meta["holdout_best_new"] = best_new(held)
    return holdout_md(held)


SECTIONS = [  # summary.md in the order a reader meets it
    Section(None, None, None, md.header_md),
    Section(None, None, None, md.headline_md),
    Section(None, None, None, md.by_kind_md),
    Section(None, None, None, md.heatmap_md),
    Section("theory", lambda r: r.theory, "theory.csv", md.theory_md),
    Section(None, None, None, md.peer_missing_md),
    Section("peer", lambda r: r.peers, "peer.csv", md.peer_md),
    Section("engines", lambda r: r.engines, "engines.csv", md.engines_md),
    Section("validation", lambda r: r.val, "validation.csv", md.validation_md),
    Section(None, None, None, md.quiet_md),
    Section(None, None, None, md.wall_md),
    Section("positions", _positions, "positions.csv", _positions_md),
    Section("copy_prompts", lambda r: kind_holdout(r.runs), "copy_prompts.csv", lambda r, f: kind_holdout_md(f)),
    Section("holdout", lambda r: holdout_frame(r.runs), "holdout.csv", _holdout_md),
    Section("kinds", lambda r: kind_answer(r.runs), "kinds.csv",
            lambda r, f: kind_answer_md(f, f"cost profile `{r.meta.get('cost_profile')}`")),
    Section("kinds_holdout", lambda r: leave_one_kind_out(r.runs), "kinds_holdout.csv",
            lambda r, f: leave_one_kind_out_md(f)),
    Section("regret", lambda r: regret_frame(r.runs), "regret.csv", lambda r, f: regret_md(f)),
    Section("drafters", lambda r: drafter_answer(r.runs), "drafters.csv", lambda r, f: drafter_answer_md(f)),
    Section("hybrid_pairs", lambda r: paired(r.runs), "hybrid_pairs.csv", lambda r, f: paired_md(f)),
    Section(None, None, None, md.prompts_md),
]
UNLISTED = ("theory", "peer", "engines", "validation")  # CSVs written but not named in the files a run returns


def write_sections(r: Report, files: dict) -> str:
    """Every section in order: its CSV written and its words added to summary.md's text, which is returned."""
    text = ""
    for section in SECTIONS:
        frame = section.frame(r) if section.frame is not None else None
        if section.frame is not None and (frame is None or frame.empty):
            continue
        words = section.markdown(r, frame)
        if frame is not None:
            frame.to_csv(r.out / section.csv, index=False)
            if section.name not in UNLISTED:
                files[section.name] = r.out / section.csv
        elif not words:
            continue
        text = text.rstrip("\n") + "\n\n" + words if text else words
    return text


def _run_figures(r: Report) -> None:
    """What the meta records of the runs as a whole: the engine's overhead, the validation, the quiet-cost check, ours
    over the peer, and (a replay) the best settings, with the theory where the meta holds the costs."""
    meta, runs, peers = r.meta, r.runs, r.peers
    timed_ours = runs[(runs["mode"] == "timed") & (runs["implementation"] == "ours")] if r.modes else runs
    spec_rows = timed_ours[timed_ours["strategy"] != AUTOREGRESSIVE] if not timed_ours.empty else timed_ours
    meta["overhead_pct_mean"] = (float(pd.to_numeric(spec_rows["overhead_pct"], errors="coerce").mean())
                                 if not spec_rows.empty else math.nan)
    meta["validation"] = r.validation
    meta["quiet"] = quiet_outcome(runs)
    meta["ours_over_hf_total"] = (float(peers["seconds_ours"].sum() / peers["seconds_hf"].sum())
                                  if not peers.empty else math.nan)
    spec_peers = peers[peers["strategy"] != AUTOREGRESSIVE] if not peers.empty else peers
    meta["ours_over_hf_speculative"] = (float(spec_peers["seconds_ours"].sum() / spec_peers["seconds_hf"].sum())
                                        if not spec_peers.empty else math.nan)
    if "replay" in r.modes:
        meta["best"] = best_settings(r.summary)
        if r.theory is None and meta.get("costs") and meta.get("alpha") is not None:
            costs = CostModel.from_dict(meta["costs"])
            r.theory = theory_frame(float(meta["alpha"]), costs.cost_ratio, costs, r.summary)


def write_reports(out: Path, runs: pd.DataFrame, meta: dict, theory: pd.DataFrame | None = None,
                  drafts: pd.DataFrame | None = None, prompts: pd.DataFrame | None = None) -> dict:
    """Every summary output from runs.csv's rows and the run's meta (also used by ``--report-only``); ``drafts``
    (every replayed drafting iteration of this run) gives ``positions.csv`` and ``prompts`` (one row per prompt:
    ``disco.tables.rows``) ``prompts.csv``; ``None`` (``--report-only``) keeps the ones the run wrote."""
    r = Report(out, meta, add_decode_speedup(runs), theory, drafts)
    _run_figures(r)
    out.mkdir(parents=True, exist_ok=True)
    r.runs.to_csv(out / "runs.csv", index=False)
    r.summary.to_csv(out / "summary.csv", index=False)
    files = {"runs": out / "runs.csv", "summary": out / "summary.csv", "summary_md": out / "summary.md",
             "meta": out / "meta.json"}
    if "replay" in r.modes and not r.summary.empty:
        fig = heatmap_figure(r.summary)
        # plotly.min.js beside the page (written once per folder): the report opens offline
        fig.write_html(out / "heatmap.html", include_plotlyjs="directory", full_html=True)
        (out / "heatmap.svg").write_text(heatmap_svg(r.summary), encoding="utf-8")
        files.update(heatmap_html=out / "heatmap.html", heatmap_svg=out / "heatmap.svg")
        _write_png(fig, out, files, meta)
    text = write_sections(r, files)
    if prompts is not None and not prompts.empty:
        prompts.to_csv(out / "prompts.csv", index=False)
    if (out / "prompts.csv").is_file():
        files["prompts"] = out / "prompts.csv"
    (out / "summary.md").write_text(text, encoding="utf-8")
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=_json_default), encoding="utf-8")
    return {"files": files, "meta": meta, "summary": r.summary, "runs": r.runs, "validation": r.validation,
            "peers": r.peers}


def _write_png(fig, out: Path, files: dict, meta: dict) -> None:
    """heatmap.png where kaleido happens to be installed (it is not a dependency); any other failure is named in the
    meta and the log, never passed off as a missing package."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        meta["heatmap_png"] = "skipped (kaleido not installed)"
        return
    try:
        fig.write_image(out / "heatmap.png")
        files["heatmap_png"] = out / "heatmap.png"
    except Exception as exc:  # noqa: BLE001 - kaleido drives a browser: its failures have many types
        log.warning("heatmap.png not written", exc_info=True)
        meta["heatmap_png"] = f"failed ({type(exc).__name__}: {first_line(exc)[:200]})"


def _headline_specs(best: dict) -> list[str]:
    """The settings the report headlines: the replay's best of each kind that drafts, and the reference setting."""
    keys = ("best_static", "best_threshold", "best_pmin", "best_lookup", "best_copy", "best_disco")
    return list(dict.fromkeys([REFERENCE_SETTING] + [best[k] for k in keys if best.get(k)]))


def report_only(out: Path) -> dict:
    """Rebuild the summaries from an earlier run's runs.csv and meta.json (no models needed)."""
    try:
        runs = pd.read_csv(out / "runs.csv")
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"--report-only needs runs.csv and meta.json in {out}: {exc}") from None
    return write_reports(out, ensure_policy_columns(runs), meta)


def _json_default(o):
    if isinstance(o, float) and o != o:
        return None
    if isinstance(o, Path):
        return str(o)
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)
