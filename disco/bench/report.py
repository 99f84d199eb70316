"""The benchmark's report files (summary.md, CSVs, heatmaps, meta.json), from the runs table and the meta alone."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pandas as pd

from disco.bench.heatmap import heatmap_figure, heatmap_grid, heatmap_svg
from disco.bench.kinds import kind_answer, kind_answer_md, leave_one_kind_out, leave_one_kind_out_md
from disco.bench.drafters import drafter_answer, drafter_answer_md, paired, paired_md
from disco.bench.online import regret_frame, regret_md
from disco.bench.build import prompts_md
from disco.bench.holdout import best_new, holdout_frame, holdout_md, kind_holdout, kind_holdout_md
from disco.bench.positions import positions_frame, positions_md
from disco.bench.runs import ensure_policy_columns
from disco.costs import model as cost_mod
from disco.costs.model import CostModel
from disco.errors import BenchError, first_line
from disco.policies import AUTOREGRESSIVE, STATIC_KS
from disco.suites import BUILTIN_KINDS as KINDS
from disco.text import fmt as _fmt
from disco.bench.analysis import (
    REFERENCE_SETTING, add_decode_speedup, best_settings, engine_frame, overall_rows, peer_frame, quiet_outcome,
    summarize_runs, theory_frame, validation_frame, validation_outcome,
)


log = logging.getLogger(__name__)


# summary.md


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _identical_cell(row) -> str:
    cell = _fmt(row.identical_to_autoregressive)
    detail = getattr(row, "divergence", "")
    return f"{cell} ({detail})" if detail and isinstance(detail, str) else cell


def _cost_sentence(meta: dict) -> str:
    name = meta.get("cost_profile", cost_mod.MEASURED)
    if name == cost_mod.MEASURED:
        return "Replay seconds are estimated from per-pass costs measured on this machine (cost profile `measured`)."
    if str(name).startswith("flat:"):
        return (f"Cost profile `{name}`: replay time counts every target pass as one step and every assistant pass as "
                f"{name.split(':', 1)[1]} of a step (verification free, as on a GPU with a tiny draft); the "
                "iterations are the exact replay of this pair, only the costs are hypothetical.")
    return f"Cost profile `{name}`: replay seconds use per-pass costs read from that CSV (measured elsewhere)."


def _classifier_sentence(meta: dict) -> str:
    clf = meta.get("disco_classifier")
    if not clf:
        return ""
    return (f"  \n`disco` lanes: classifier `{clf.get('path')}` (stop threshold {_fmt(clf.get('threshold'))}, tuned under "
            f"cost profile `{clf.get('cost_profile')}` with the {clf.get('assistant_precision')} assistant; "
            f"test-split ROC AUC {_fmt(clf.get('test_roc_auc'), '.3f')}).")


def engines_md(engines: pd.DataFrame | None) -> list[str]:
    """The timed settings against plain decoding of the same target: llama.cpp's own, and the other engine's."""
    if engines is None or engines.empty:
        return []
    has_plain, has_other = "decode_vs_llama_plain" in engines, "vs_other_engine" in engines
    named = engines["other_engine"].dropna() if has_other else engines.iloc[0:0]
    other = str(named.iloc[0]) if not named.empty else ""
    header = ["strategy", "prompts", "tokens/s (decode)"]
    header += ["÷ llama.cpp plain decoding (decode)"] if has_plain else []
    header += [f"÷ {other} target alone (whole run)", f"÷ {other} (decode)"] if has_other else []
    rows = []
    for r in engines.to_dict("records"):
        row = [f"`{r['strategy']}`", r["prompts"], _fmt(r["decode_tokens_per_s"], ".1f")]
        row += [_fmt(r.get("decode_vs_llama_plain"), ".3f") + "x"] if has_plain else []
        row += [_fmt(r.get("vs_other_engine"), ".2f") + "x", _fmt(r.get("decode_vs_other_engine"), ".2f") + "x"] \
            if has_other else []
        rows.append(row)
    lines = ["", "## Against plain decoding on each engine (timed, same prompts)", "", _md_table(header, rows)]
    spec = engines[engines["strategy"] != AUTOREGRESSIVE]
    notes = []
    if has_plain:
        plain = engines["llama_plain_tokens_per_s"].dropna()
        notes.append(f"llama.cpp's plain decoding (llama-bench, its default kernels): "
                     f"{_fmt(plain.iloc[0] if not plain.empty else None, '.1f')} tokens/s")
    if has_other:
        rate = engines["other_tokens_per_s"].dropna()
        notes.append(f"the {other} engine's target alone: {_fmt(rate.iloc[0] if not rate.empty else None, '.2f')} "
                     "tokens/s (whole run)")
    key = "decode_vs_llama_plain" if has_plain else "vs_other_engine"
    ranked = spec[key].astype(float).dropna() if not spec.empty else spec
    if not ranked.empty:
        fastest = spec.loc[ranked.idxmax()]
        notes.append(f"fastest speculative lane `{fastest['strategy']}`: "
                     + (f"{_fmt(fastest.get('decode_vs_llama_plain'), '.3f')}x llama.cpp's plain decoding"
                        if has_plain else "")
                     + (f"{'; ' if has_plain else ''}{_fmt(fastest.get('vs_other_engine'), '.2f')}x the {other} "
                        f"target alone's tokens/s" if has_other else ""))
    lines += ["", "; ".join(notes) + ". Geometric means over the timed prompts of per-prompt ratios."]
    return lines


def _peer_missing_md(missing: list[dict]) -> list[str]:
    """The peer runs left out because llama.cpp's example printed no figures (``disco.bench.llama_peer``)."""
    if not missing:
        return []
    return ["", f"{len(missing)} run(s) of llama.cpp's example are missing from the peer table: it exited before its "
                "logger printed its figures in every try (a busy machine; " +
                ", ".join(f"{m['prompt']} `{m['strategy']}`" for m in missing[:5]) + ")."]


def _quiet_md(quiet: dict) -> list[str]:
    """The timed runs' quiet-cost check (``analysis.quiet_outcome``): how many kept to this machine's pass costs."""
    if not quiet.get("checked"):
        return []
    faster = quiet.get("faster", 0)
    within = quiet["checked"] - quiet["busy"] - faster
    return ["", f"Quiet-cost check: {within} of {quiet['checked']} timed runs took within ±10 % of what their own "
                f"iterations cost under the per-pass costs measured here (median live ÷ quiet "
                f"{quiet['median']:.3f}, furthest {quiet['worst']:.3f})"
            + (f"; {quiet['busy']} took longer: the machine was busy while they ran (runs.csv: live_over_quiet), "
               "so their speed-ups are not this machine's" if quiet["busy"] else "")
            + (f"; {faster} ran faster than those costs say: the cost profile overstates this machine now (measured "
               "at a busier moment; `python -m disco profile` measures it again)" if faster else "") + "."]


def summary_markdown(meta: dict, summary: pd.DataFrame, theory: pd.DataFrame | None, validation: dict,
                     val: pd.DataFrame, peers: pd.DataFrame, engines: pd.DataFrame | None = None) -> str:
    # The report's sections in the order a reader meets them (header, headline, heatmap, theory, validation,
    # peer); one function so that section order and shared numbers (``best``) are read in one place.
    best = meta.get("best", {})
    parts = [f"# DISCO Lab benchmark: {meta.get('models')} ({meta.get('dtype')}, {meta.get('device')}, "
             f"{meta.get('assistant_precision', 'model')} assistant)", ""]
    parts.append(
        f"Command: `{meta.get('command')}`  \n"
        f"Machine: {meta.get('machine', meta.get('cpu'))}  \n"
        f"Suite: {meta.get('suite')} ({meta.get('prompts_replayed', 0)} prompts replayed, "
        f"{meta.get('prompts_timed', 0)} timed), max_new_tokens={meta.get('max_new_tokens')}, greedy.  \n"
        f"Versions: torch {meta.get('torch')}, transformers {meta.get('transformers')}, python {meta.get('python')}; "
        f"threads {meta.get('threads')}; scikit-learn installed: {_fmt(meta.get('sklearn_available'))} "
        f"(transformers then adapts any non-zero threshold with an ROC curve: the `hf:adaptive` peer keeps that on, "
        f"the fixed-threshold peers switch it off).  \n"
        f"Speed-up = autoregressive seconds / strategy seconds per prompt; geometric mean over prompts "
        f"[min–max across prompts]; decode-only speed-up leaves out iteration 1 (prefill fused with the first "
        f"verification). {_cost_sentence(meta)}{_classifier_sentence(meta)}")
    overall = overall_rows(summary)
    if not overall.empty:
        parts += ["", "## Headline (replay, all prompts)", ""]
        rows = []
        labels = [("best static K", best.get("best_static")), ("τ = 0.4, KMAX = 20", REFERENCE_SETTING),
                  ("best threshold", best.get("best_threshold")), ("heuristic", best.get("best_heuristic")),
                  ("oracle (upper bound)", best.get("best_oracle"))]
        best_dyn = best.get("best_threshold_speedup", math.nan)
        for label, spec in labels:
            if not spec or spec not in overall.index:
                continue
            r = overall.loc[spec]
            rows.append([label, f"`{spec}`", f"{r['speedup_geomean']:.3f}x",
                         f"{r['speedup_min']:.2f}–{r['speedup_max']:.2f}", _fmt(r["decode_speedup_geomean"], ".3f") + "x",
                         _fmt(100 * (r['speedup_geomean'] / best_dyn - 1), "+.1f") + " %",
                         _fmt(r["acceptance_rate_mean"]), _fmt(r["mean_lookahead_mean"], ".1f")])
        parts.append(_md_table(["setting", "spec", "speed-up", "spread", "decode-only speed-up", "vs best threshold",
                                "acceptance", "mean lookahead"], rows))
        ref = best.get("reference_speedup", math.nan)
        dec = best_settings(summary, "decode_speedup_geomean")
        if dec:
            parts += ["", f"Decode loop only (iteration 1, which carries the prefill, excluded): best static "
                          f"`{dec['best_static']}` {_fmt(dec['best_static_speedup'])}x, `{REFERENCE_SETTING}` "
                          f"{_fmt(dec['reference_speedup'])}x, best threshold `{dec['best_threshold']}` "
                          f"{_fmt(dec['best_threshold_speedup'])}x, oracle {_fmt(dec['best_oracle_speedup'])}x."]
        parts += ["", f"τ = 0.4 / KMAX 20 reaches {_fmt(100 * ref / best_dyn, '.1f')} % of the best threshold "
                      f"setting's speed-up and {_fmt(100 * ref / best.get('best_static_speedup', math.nan), '.1f')} % of "
                      f"the best static K's (oracle: {_fmt(best.get('best_oracle_speedup'), '.2f')}x)."]
        kinds = [k for k in KINDS if k in set(summary["kind"])] + sorted(set(summary["kind"]) - set(KINDS) - {"all"})
        rs = summary[(summary["mode"] == "replay")]
        specs = [s for s in [AUTOREGRESSIVE, best.get("best_static"), REFERENCE_SETTING, best.get("best_threshold"),
                             best.get("best_heuristic"), best.get("best_oracle")] if s]
        specs = list(dict.fromkeys(specs))
        if kinds:
            parts += ["", "## By kind of prompt (replay, geometric-mean speed-up)", ""]
            rows = []
            for spec in specs:
                cells = []
                for kind in kinds:
                    r = rs[(rs["strategy"] == spec) & (rs["kind"] == kind)]
                    cells.append(_fmt(float(r["speedup_geomean"].iloc[0]), ".2f") if not r.empty else "—")
                    # best of each kind, for reference
                rows.append([f"`{spec}`"] + cells)
            best_row = []
            for kind in kinds:
                r = rs[(rs["kind"] == kind) & rs["strategy"].str.startswith(("static:", "threshold:"))]
                if r.empty:
                    best_row.append("—")
                else:
                    i = r["speedup_geomean"].idxmax()
                    best_row.append(f"{r.loc[i, 'speedup_geomean']:.2f} (`{r.loc[i, 'strategy']}`)")
            rows.append(["best static/threshold"] + best_row)
            parts.append(_md_table(["strategy"] + kinds, rows))
        taus, ks, z = heatmap_grid(summary)
        if taus:
            parts += ["", "## Heatmap: speed-up over τ × KMAX (replay)", "",
                      "![heatmap](heatmap.svg)", ""]
            rows = [[format(t, "g")] + [_fmt(v) for v in zrow] for t, zrow in zip(taus, z)]
            parts.append(_md_table(["τ \\ KMAX"] + [str(k) for k in ks], rows))
            static = [(s, overall.loc[s, "speedup_geomean"]) for s in overall.index if s.startswith("static:")]
            if static:
                parts += ["", "Static K: " + ", ".join(f"K={s.split(':')[1]}: {v:.2f}" for s, v in static)]
    if theory is not None and not theory.empty:
        alpha, c = theory["alpha"].iloc[0], theory["c"].iloc[0]
        kt = int(theory.loc[theory["theory_speedup"].idxmax(), "K"])
        km = int(theory.loc[theory["theory_speedup_measured_verify"].idxmax(), "K"]) if theory[
            "theory_speedup_measured_verify"].notna().any() else None
        rep = theory.dropna(subset=["replay_speedup"])
        kr = int(rep.loc[rep["replay_speedup"].idxmax(), "K"]) if not rep.empty else None
        parts += ["", "## Theory beside measurement (Leviathan et al. 2023)", "",
                  f"Measured per-token acceptance α = {alpha:.3f} (assistant's first draft = target's token, over all "
                  f"positions), cost ratio c = t_draft / t_target = {c:.3f}. The formula's optimal static K is "
                  f"**{kt}**; with the measured cost of verifying k+1 tokens it is **{km}**; replay's best static K "
                  f"is **{kr}**.", ""]
        rows = [[int(r.K), _fmt(r.theory_tokens_per_iteration), _fmt(r.theory_speedup), _fmt(r.theory_speedup_measured_verify),
                 _fmt(r.replay_speedup)] for r in theory.itertuples() if int(r.K) in set(STATIC_KS) | {kt}]
        parts.append(_md_table(["K", "E[tokens/iter]", "theory speed-up", "theory w/ measured verify cost",
                                "replay speed-up"], rows))
        costs = meta.get("costs")
        if costs:
            t = dict((int(n), ms) for n, ms in costs["target"])
            a = dict((int(n), ms) for n, ms in costs["assistant"])
            parts += ["", "Measured per-pass costs (median ms): target " +
                      ", ".join(f"{n} tok {ms:.0f}" for n, ms in sorted(t.items())) + "; assistant " +
                      ", ".join(f"{n} tok {ms:.0f}" for n, ms in sorted(a.items())) + "."]
    parts += _peer_missing_md(meta.get("peer_missing") or [])
    if peers is not None and not peers.empty:
        name = str(peers["peer"].iloc[0]) if "peer" in peers else "transformers"
        what = ("transformers' assisted generation" if name == "transformers" else
                "llama.cpp's own programs (llama-speculative-simple for `pmin` settings, llama-bench for plain "
                "decoding; decode phase, with llama.cpp's default kernels)")
        parts += ["", f"## Our engine against {what} (timed, same prompts and settings)", ""]
        rows = [[f"`{r.strategy}`", r.prompts, _fmt(r.seconds_ours, ".1f"), _fmt(r.seconds_hf, ".1f"),
                 _fmt(r.ratio_ours_over_hf, ".3f"), _fmt(r.ratio_median_per_prompt, ".3f"), _fmt(r.speedup_ours), _fmt(r.speedup_hf), _fmt(r.same_text),
                 _fmt(r.equal_target_passes), f"{r.target_passes_ours} / {_fmt(r.target_passes_hf, 'd')}",
                 _fmt(r.overhead_pct_ours, ".1f")] for r in peers.itertuples()]
        parts.append(_md_table(["strategy", "prompts", "ours s", "peer s", "ours / peer", "median per prompt",
                                "speed-up ours", "speed-up peer",
                                "same text", "equal target passes", "target passes ours / peer", "overhead % (ours)"], rows))
        total = peers["seconds_ours"].sum() / peers["seconds_hf"].sum()
        parts += ["", f"Total seconds ours / {name} over all timed settings: **{total:.3f}** "
                      f"(speculative settings only: {_fmt(meta.get('ours_over_hf_speculative'), '.3f')}; goal ≤ 1.0). "
                      f"Speed-ups are against each implementation's own autoregressive run. Engine overhead (time outside the two models' forward passes) averages "
                      f"{_fmt(meta.get('overhead_pct_mean'), '.2f')} % of iteration time (goal < 5 %)."]
    parts += engines_md(engines)
    if validation.get("checked"):
        parts += ["", "## Validation: replay against timed runs", "",
                  f"{validation['exact']} of {validation['checked']} timed runs have exactly the iterations and target "
                  f"passes replay predicted ({validation['exact_assistant']} also the assistant passes). Predicted "
                  f"time vs measured, summed per strategy: "
                  + ", ".join(f"`{k}` {v:+.1f} %" for k, v in validation["time_error_pct_by_strategy"].items())
                  + f"; total {validation['time_error_pct_total']:+.1f} % (tolerance ±{validation['tolerance_pct']:.0f} %, "
                  f"median absolute per-run error {validation['time_error_pct_rows_median_abs']:.1f} %). "
                  f"Outcome: counts **{'exact' if validation['counts_ok'] else 'NOT exact'}**, time "
                  f"**{'within' if validation['time_ok'] else 'OUTSIDE'}** tolerance.", ""]
        rows = [[r.prompt_id, f"`{r.strategy}`", f"{r.iterations_predicted} / {r.iterations_measured}",
                 f"{r.target_passes_predicted} / {r.target_passes_measured}",
                 f"{r.seconds_predicted:.2f} / {r.seconds_measured:.2f}", f"{r.time_error_pct:+.1f}",
                 _identical_cell(r)] for r in val.itertuples()]
        parts.append(_md_table(["prompt", "strategy", "iterations pred / meas", "target passes pred / meas",
                                "seconds pred / meas", "error %", "identical"], rows))
        if not validation["counts_ok"] and str(meta.get("dtype")) == "bf16":
            parts += ["", "In bf16, counts can differ while the text stays identical: the assistant's logits depend "
                      "on how it is fed (a live run feeds it on top of its own cache, replay's table computes each "
                      "chain from a prefix; an int8 assistant's dynamic activation scales also depend on the tokens "
                      "in each call), so a near-tied draft token can differ and an iteration accepts one token more "
                      "or less. The target decides the text, which is why it does not change. In fp32, replay "
                      "matches the engine exactly (tests/unit/test_replay.py)."]
    parts += _quiet_md(meta.get("quiet") or {})
    parts += ["", f"Wall time of this benchmark: {_fmt(meta.get('wall_seconds'), '.0f')} s.", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------


def write_reports(out: Path, runs: pd.DataFrame, meta: dict, theory: pd.DataFrame | None = None,
                  drafts: pd.DataFrame | None = None, prompts: pd.DataFrame | None = None) -> dict:
    """Every summary output from runs.csv's rows and the run's meta (also used by ``--report-only``); ``drafts``
    (every replayed drafting iteration of this run) gives ``positions.csv`` and ``prompts`` (one row per prompt:
    ``disco.bench.build``) ``prompts.csv``; ``None`` (``--report-only``) keeps the ones the run wrote."""
    runs_df = add_decode_speedup(runs)
    summary = summarize_runs(runs_df)
    modes = set(runs_df["mode"]) if not runs_df.empty else set()
    val = validation_frame(runs_df) if {"replay", "timed"} <= modes else pd.DataFrame()
    validation = validation_outcome(val)
    peers = peer_frame(summary, runs_df) if "timed" in modes else pd.DataFrame()
    timed_ours = runs_df[(runs_df["mode"] == "timed") & (runs_df["implementation"] == "ours")] if modes else runs_df
    spec_rows = timed_ours[timed_ours["strategy"] != AUTOREGRESSIVE] if not timed_ours.empty else timed_ours
    meta["overhead_pct_mean"] = float(pd.to_numeric(spec_rows["overhead_pct"], errors="coerce").mean()) if not spec_rows.empty else math.nan
    meta["validation"] = validation
    meta["quiet"] = quiet_outcome(runs_df)
    meta["ours_over_hf_total"] = (float(peers["seconds_ours"].sum() / peers["seconds_hf"].sum())
                                  if not peers.empty else math.nan)
    spec_peers = peers[peers["strategy"] != AUTOREGRESSIVE] if not peers.empty else peers
    meta["ours_over_hf_speculative"] = (float(spec_peers["seconds_ours"].sum() / spec_peers["seconds_hf"].sum())
                                        if not spec_peers.empty else math.nan)
    if "replay" in modes:
        meta["best"] = best_settings(summary)
        if theory is None and meta.get("costs") and meta.get("alpha") is not None:
            costs = CostModel.from_dict(meta["costs"])
            theory = theory_frame(float(meta["alpha"]), costs.cost_ratio, costs, summary)

    out.mkdir(parents=True, exist_ok=True)
    runs_df.to_csv(out / "runs.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    if theory is not None:
        theory.to_csv(out / "theory.csv", index=False)
    if not val.empty:
        val.to_csv(out / "validation.csv", index=False)
    if not peers.empty:
        peers.to_csv(out / "peer.csv", index=False)
    engines = engine_frame(runs_df) if "timed" in modes else pd.DataFrame()
    if not engines.empty:
        engines.to_csv(out / "engines.csv", index=False)
    files = {"runs": out / "runs.csv", "summary": out / "summary.csv", "summary_md": out / "summary.md",
             "meta": out / "meta.json"}
    if "replay" in modes and not summary.empty:
        fig = heatmap_figure(summary)
        # plotly.min.js beside the page (written once per folder): the report opens offline
        fig.write_html(out / "heatmap.html", include_plotlyjs="directory", full_html=True)
        (out / "heatmap.svg").write_text(heatmap_svg(summary), encoding="utf-8")
        files.update(heatmap_html=out / "heatmap.html", heatmap_svg=out / "heatmap.svg")
        _write_png(fig, out, files, meta)
    held = holdout_frame(runs_df)
    text = summary_markdown(meta, summary, theory, validation, val, peers, engines)
    if drafts is not None:  # this run's own drafts (none in a timed-only run): never an earlier run's file
        positions = positions_frame(drafts) if not drafts.empty else pd.DataFrame()
        if positions.empty:
            (out / "positions.csv").unlink(missing_ok=True)
    else:  # --report-only: the positions the run wrote
        positions = pd.read_csv(out / "positions.csv") if (out / "positions.csv").is_file() else pd.DataFrame()
    if not positions.empty:
        positions.to_csv(out / "positions.csv", index=False)
        files["positions"] = out / "positions.csv"
        shown = [s for s in meta.get("timed_strategies") or _headline_specs(meta.get("best", {}))
                 if s != AUTOREGRESSIVE]
        kinds = ("all", "copy") if "copy" in set(positions["kind"]) else ("all",)
        text = text.rstrip("\n") + "\n\n" + positions_md(positions, shown, kinds)
    copy = kind_holdout(runs_df)
    if not copy.empty:
        copy.to_csv(out / "copy_prompts.csv", index=False)
        files["copy_prompts"] = out / "copy_prompts.csv"
        text = text.rstrip("\n") + "\n\n" + kind_holdout_md(copy)
    if not held.empty:
        held.to_csv(out / "holdout.csv", index=False)
        files["holdout"] = out / "holdout.csv"
        meta["holdout_best_new"] = best_new(held)
        text = text.rstrip("\n") + "\n\n" + holdout_md(held)
    text = _kind_sections(out, runs_df, meta, text, files)
    if prompts is not None and not prompts.empty:
        prompts.to_csv(out / "prompts.csv", index=False)
    if (out / "prompts.csv").is_file():
        files["prompts"] = out / "prompts.csv"
    (out / "summary.md").write_text(text, encoding="utf-8")
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=_json_default), encoding="utf-8")
    return {"files": files, "meta": meta, "summary": summary, "runs": runs_df, "validation": validation, "peers": peers}


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


def _kind_sections(out: Path, runs: pd.DataFrame, meta: dict, text: str, files: dict) -> str:
    """The per-kind answer and the leave-one-kind-out table (CSV and summary.md), then the prompts section."""
    answer = kind_answer(runs)
    if not answer.empty:
        answer.to_csv(out / "kinds.csv", index=False)
        files["kinds"] = out / "kinds.csv"
        text = text.rstrip("\n") + "\n\n" + kind_answer_md(answer, f"cost profile `{meta.get('cost_profile')}`")
    loko = leave_one_kind_out(runs)
    if not loko.empty:
        loko.to_csv(out / "kinds_holdout.csv", index=False)
        files["kinds_holdout"] = out / "kinds_holdout.csv"
        text = text.rstrip("\n") + "\n\n" + leave_one_kind_out_md(loko)
    for name, frame, md in (("regret", regret_frame(runs), regret_md),
                            ("drafters", drafter_answer(runs), drafter_answer_md), ("hybrid_pairs", paired(runs), paired_md)):
        if not frame.empty:
            frame.to_csv(out / f"{name}.csv", index=False)
            files[name] = out / f"{name}.csv"
            text = text.rstrip("\n") + "\n\n" + md(frame)
    section = prompts_md(meta)
    return text.rstrip("\n") + "\n\n" + section if section else text


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
