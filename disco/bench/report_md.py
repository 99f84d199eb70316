"""The sections of a benchmark's summary.md, one function each: ``section(report, frame) -> str`` (empty: the run
has nothing for it). ``disco.bench.report`` lists them with their frames and CSV files and writes them in one loop;
this module only words them."""

from __future__ import annotations

import math

import pandas as pd

from disco.bench.analysis import REFERENCE_SETTING, best_settings, overall_rows
from disco.bench.heatmap import heatmap_grid
from disco.costs import model as cost_mod
from disco.policies import AUTOREGRESSIVE, STATIC_KS
from disco.suites import BUILTIN_KINDS as KINDS
from disco.text import fmt as _fmt


def md_table(header: list[str], rows: list[list]) -> str:
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


def header_md(r, frame=None) -> str:
    """The title and what the run was: command, machine, suite, versions, how speed-ups and costs are counted."""
    meta = r.meta
    return (f"# DISCO Lab benchmark: {meta.get('models')} ({meta.get('dtype')}, {meta.get('device')}, "
            f"{meta.get('assistant_precision', 'model')} assistant)\n\n"
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


def headline_md(r, frame=None) -> str:
    """The headline settings over all prompts (replay), the decode loop alone, and τ = 0.4's share of the best."""
    overall, best, summary = overall_rows(r.summary), r.meta.get("best", {}), r.summary
    if overall.empty:
        return ""
    labels = [("best static K", best.get("best_static")), ("τ = 0.4, KMAX = 20", REFERENCE_SETTING),
              ("best threshold", best.get("best_threshold")), ("heuristic", best.get("best_heuristic")),
              ("oracle (upper bound)", best.get("best_oracle"))]
    best_dyn = best.get("best_threshold_speedup", math.nan)
    rows = []
    for label, spec in labels:
        if not spec or spec not in overall.index:
            continue
        row = overall.loc[spec]
        rows.append([label, f"`{spec}`", f"{row['speedup_geomean']:.3f}x",
                     f"{row['speedup_min']:.2f}–{row['speedup_max']:.2f}",
                     _fmt(row["decode_speedup_geomean"], ".3f") + "x",
                     _fmt(100 * (row['speedup_geomean'] / best_dyn - 1), "+.1f") + " %",
                     _fmt(row["acceptance_rate_mean"]), _fmt(row["mean_lookahead_mean"], ".1f")])
    parts = ["## Headline (replay, all prompts)", "",
             md_table(["setting", "spec", "speed-up", "spread", "decode-only speed-up", "vs best threshold",
                       "acceptance", "mean lookahead"], rows)]
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
    return "\n".join(parts)


def by_kind_md(r, frame=None) -> str:
    """The headline settings per kind of prompt, and each kind's best static or threshold setting."""
    summary, best = r.summary, r.meta.get("best", {})
    if overall_rows(summary).empty:
        return ""
    kinds = [k for k in KINDS if k in set(summary["kind"])] + sorted(set(summary["kind"]) - set(KINDS) - {"all"})
    if not kinds:
        return ""
    rs = summary[(summary["mode"] == "replay")]
    specs = [s for s in [AUTOREGRESSIVE, best.get("best_static"), REFERENCE_SETTING, best.get("best_threshold"),
                         best.get("best_heuristic"), best.get("best_oracle")] if s]
    rows = []
    for spec in dict.fromkeys(specs):
        cells = []
        for kind in kinds:
            row = rs[(rs["strategy"] == spec) & (rs["kind"] == kind)]
            cells.append(_fmt(float(row["speedup_geomean"].iloc[0]), ".2f") if not row.empty else "—")
        rows.append([f"`{spec}`"] + cells)
    best_row = []
    for kind in kinds:
        row = rs[(rs["kind"] == kind) & rs["strategy"].str.startswith(("static:", "threshold:"))]
        if row.empty:
            best_row.append("—")
        else:
            i = row["speedup_geomean"].idxmax()
            best_row.append(f"{row.loc[i, 'speedup_geomean']:.2f} (`{row.loc[i, 'strategy']}`)")
    rows.append(["best static/threshold"] + best_row)
    return "\n".join(["## By kind of prompt (replay, geometric-mean speed-up)", "",
                      md_table(["strategy"] + kinds, rows)])


def heatmap_md(r, frame=None) -> str:
    """The speed-up over τ × KMAX (the heatmap beside it), and static K's."""
    overall = overall_rows(r.summary)
    if overall.empty:
        return ""
    taus, ks, z = heatmap_grid(r.summary)
    if not taus:
        return ""
    rows = [[format(t, "g")] + [_fmt(v) for v in zrow] for t, zrow in zip(taus, z)]
    parts = ["## Heatmap: speed-up over τ × KMAX (replay)", "", "![heatmap](heatmap.svg)", "",
             md_table(["τ \\ KMAX"] + [str(k) for k in ks], rows)]
    static = [(s, overall.loc[s, "speedup_geomean"]) for s in overall.index if s.startswith("static:")]
    if static:
        parts += ["", "Static K: " + ", ".join(f"K={s.split(':')[1]}: {v:.2f}" for s, v in static)]
    return "\n".join(parts)


def theory_md(r, theory: pd.DataFrame | None) -> str:
    """Leviathan et al.'s prediction beside replay's, and the per-pass costs it used."""
    if theory is None or theory.empty:
        return ""
    alpha, c = theory["alpha"].iloc[0], theory["c"].iloc[0]
    kt = int(theory.loc[theory["theory_speedup"].idxmax(), "K"])
    km = int(theory.loc[theory["theory_speedup_measured_verify"].idxmax(), "K"]) if theory[
        "theory_speedup_measured_verify"].notna().any() else None
    rep = theory.dropna(subset=["replay_speedup"])
    kr = int(rep.loc[rep["replay_speedup"].idxmax(), "K"]) if not rep.empty else None
    rows = [[int(t.K), _fmt(t.theory_tokens_per_iteration), _fmt(t.theory_speedup),
             _fmt(t.theory_speedup_measured_verify), _fmt(t.replay_speedup)]
            for t in theory.itertuples() if int(t.K) in set(STATIC_KS) | {kt}]
    parts = ["## Theory beside measurement (Leviathan et al. 2023)", "",
             f"Measured per-token acceptance α = {alpha:.3f} (assistant's first draft = target's token, over all "
             f"positions), cost ratio c = t_draft / t_target = {c:.3f}. The formula's optimal static K is "
             f"**{kt}**; with the measured cost of verifying k+1 tokens it is **{km}**; replay's best static K "
             f"is **{kr}**.", "",
             md_table(["K", "E[tokens/iter]", "theory speed-up", "theory w/ measured verify cost", "replay speed-up"],
                      rows)]
    costs = r.meta.get("costs")
    if costs:
        t = dict((int(n), ms) for n, ms in costs["target"])
        a = dict((int(n), ms) for n, ms in costs["assistant"])
        parts += ["", "Measured per-pass costs (median ms): target " +
                  ", ".join(f"{n} tok {ms:.0f}" for n, ms in sorted(t.items())) + "; assistant " +
                  ", ".join(f"{n} tok {ms:.0f}" for n, ms in sorted(a.items())) + "."]
    return "\n".join(parts)


def peer_missing_md(r, frame=None) -> str:
    """The peer runs left out because llama.cpp's example printed no figures (``disco.bench.llama_peer``)."""
    missing = r.meta.get("peer_missing") or []
    if not missing:
        return ""
    return (f"{len(missing)} run(s) of llama.cpp's example are missing from the peer table: it exited before its "
            "logger printed its figures in every try (a busy machine; " +
            ", ".join(f"{m['prompt']} `{m['strategy']}`" for m in missing[:5]) + ").")


def peer_md(r, peers: pd.DataFrame | None) -> str:
    """Our engine against the peer's (transformers' assisted generation, or llama.cpp's own programs)."""
    if peers is None or peers.empty:
        return ""
    meta = r.meta
    name = str(peers["peer"].iloc[0]) if "peer" in peers else "transformers"
    what = ("transformers' assisted generation" if name == "transformers" else
            "llama.cpp's own programs (llama-speculative-simple for `pmin` settings, llama-bench for plain "
            "decoding; decode phase, with llama.cpp's default kernels)")
    rows = [[f"`{p.strategy}`", p.prompts, _fmt(p.seconds_ours, ".1f"), _fmt(p.seconds_hf, ".1f"),
             _fmt(p.ratio_ours_over_hf, ".3f"), _fmt(p.ratio_median_per_prompt, ".3f"), _fmt(p.speedup_ours),
             _fmt(p.speedup_hf), _fmt(p.same_text), _fmt(p.equal_target_passes),
             f"{p.target_passes_ours} / {_fmt(p.target_passes_hf, 'd')}", _fmt(p.overhead_pct_ours, ".1f")]
            for p in peers.itertuples()]
    total = peers["seconds_ours"].sum() / peers["seconds_hf"].sum()
    return "\n".join([
        f"## Our engine against {what} (timed, same prompts and settings)", "",
        md_table(["strategy", "prompts", "ours s", "peer s", "ours / peer", "median per prompt", "speed-up ours",
                  "speed-up peer", "same text", "equal target passes", "target passes ours / peer",
                  "overhead % (ours)"], rows), "",
        f"Total seconds ours / {name} over all timed settings: **{total:.3f}** "
        f"(speculative settings only: {_fmt(meta.get('ours_over_hf_speculative'), '.3f')}; goal ≤ 1.0). "
        f"Speed-ups are against each implementation's own autoregressive run. Engine overhead (time outside the two "
        f"models' forward passes) averages {_fmt(meta.get('overhead_pct_mean'), '.2f')} % of iteration time "
        f"(goal < 5 %)."] + _llama_statistics_md(peers))


def _llama_statistics_md(peers: pd.DataFrame) -> list[str]:
    """llama-speculative-simple's own closing statistics beside ours, counted its way (disco.decode.acceptance)."""
    if "llamacpp_n_drafted_peer" not in peers or peers["llamacpp_n_drafted_peer"].isna().all():
        return []
    rows = [[f"`{p.strategy}`", int(p.llamacpp_prompts), f"{int(p.llamacpp_n_drafted_ours)} / {int(p.llamacpp_n_drafted_peer)}",
             f"{int(p.llamacpp_n_accept_ours)} / {int(p.llamacpp_n_accept_peer)}",
             f"{_fmt(p.llamacpp_accept_pct_ours, '.2f')} / {_fmt(p.llamacpp_accept_pct_peer, '.2f')}",
             _fmt(p.llamacpp_same_counts)]
            for p in peers.itertuples() if p.llamacpp_n_drafted_peer == p.llamacpp_n_drafted_peer]
    return ["", "### llama.cpp's printed statistics beside ours (its definitions)", "",
            md_table(["strategy", "prompts it printed", "n_drafted ours / llama.cpp", "n_accept ours / llama.cpp",
                      "accept % ours / llama.cpp", "same counts"], rows), "",
            "n_drafted: draft tokens sent to the target; n_accept: those it kept; accept = 100 · n_accept / "
            "n_drafted, as `llama-speculative-simple` prints them at its end (the glossary: docs/glossary.md). Our "
            "run stops at the token budget; llama.cpp's loop may draft past it in its last iteration, so its counts "
            "can be a few higher where the texts agree."]


def engines_md(r, engines: pd.DataFrame | None) -> str:
    """The timed settings against plain decoding of the same target: llama.cpp's own, and the other engine's."""
    if engines is None or engines.empty:
        return ""
    has_plain, has_other = "decode_vs_llama_plain" in engines, "vs_other_engine" in engines
    named = engines["other_engine"].dropna() if has_other else engines.iloc[0:0]
    other = str(named.iloc[0]) if not named.empty else ""
    header = ["strategy", "prompts", "tokens/s (decode)"]
    header += ["÷ llama.cpp plain decoding (decode)"] if has_plain else []
    header += [f"÷ {other} target alone (whole run)", f"÷ {other} (decode)"] if has_other else []
    rows = []
    for e in engines.to_dict("records"):
        row = [f"`{e['strategy']}`", e["prompts"], _fmt(e["decode_tokens_per_s"], ".1f")]
        row += [_fmt(e.get("decode_vs_llama_plain"), ".3f") + "x"] if has_plain else []
        row += [_fmt(e.get("vs_other_engine"), ".2f") + "x", _fmt(e.get("decode_vs_other_engine"), ".2f") + "x"] \
            if has_other else []
        rows.append(row)
    return "\n".join(["## Against plain decoding on each engine (timed, same prompts)", "", md_table(header, rows), "",
                      "; ".join(_engine_notes(engines, has_plain, has_other, other))
                      + ". Geometric means over the timed prompts of per-prompt ratios."])


def _engine_notes(engines: pd.DataFrame, has_plain: bool, has_other: bool, other: str) -> list[str]:
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
    return notes


def validation_md(r, val: pd.DataFrame | None) -> str:
    """Replay's prediction against the timed runs: counts exact, time within the tolerance."""
    validation = r.validation
    if not validation.get("checked"):
        return ""
    rows = [[v.prompt_id, f"`{v.strategy}`", f"{v.iterations_predicted} / {v.iterations_measured}",
             f"{v.target_passes_predicted} / {v.target_passes_measured}",
             f"{v.seconds_predicted:.2f} / {v.seconds_measured:.2f}", f"{v.time_error_pct:+.1f}",
             _identical_cell(v)] for v in val.itertuples()]
    parts = ["## Validation: replay against timed runs", "",
             f"{validation['exact']} of {validation['checked']} timed runs have exactly the iterations and target "
             f"passes replay predicted ({validation['exact_assistant']} also the assistant passes). Predicted "
             f"time vs measured, summed per strategy: "
             + ", ".join(f"`{k}` {v:+.1f} %" for k, v in validation["time_error_pct_by_strategy"].items())
             + f"; total {validation['time_error_pct_total']:+.1f} % (tolerance ±{validation['tolerance_pct']:.0f} %, "
             f"median absolute per-run error {validation['time_error_pct_rows_median_abs']:.1f} %). "
             f"Outcome: counts **{'exact' if validation['counts_ok'] else 'NOT exact'}**, time "
             f"**{'within' if validation['time_ok'] else 'OUTSIDE'}** tolerance.", "",
             md_table(["prompt", "strategy", "iterations pred / meas", "target passes pred / meas",
                       "seconds pred / meas", "error %", "identical"], rows)]
    if not validation["counts_ok"] and str(r.meta.get("dtype")) == "bf16":
        parts += ["", "In bf16, counts can differ while the text stays identical: the assistant's logits depend "
                  "on how it is fed (a live run feeds it on top of its own cache, replay's table computes each "
                  "chain from a prefix; an int8 assistant's dynamic activation scales also depend on the tokens "
                  "in each call), so a near-tied draft token can differ and an iteration accepts one token more "
                  "or less. The target decides the text, which is why it does not change. In fp32, replay "
                  "matches the engine exactly (tests/unit/test_replay.py)."]
    return "\n".join(parts)


def quiet_md(r, frame=None) -> str:
    """The timed runs' quiet-cost check (``analysis.quiet_outcome``): how many kept to this machine's pass costs."""
    quiet = r.meta.get("quiet") or {}
    if not quiet.get("checked"):
        return ""
    faster = quiet.get("faster", 0)
    within = quiet["checked"] - quiet["busy"] - faster
    return (f"Quiet-cost check: {within} of {quiet['checked']} timed runs took within ±10 % of what their own "
            f"iterations cost under the per-pass costs measured here (median live ÷ quiet "
            f"{quiet['median']:.3f}, furthest {quiet['worst']:.3f})"
            + (f"; {quiet['busy']} took longer: the machine was busy while they ran (runs.csv: live_over_quiet), "
               "so their speed-ups are not this machine's" if quiet["busy"] else "")
            + (f"; {faster} ran faster than those costs say: the cost profile overstates this machine now (measured "
               "at a busier moment; `python -m disco profile` measures it again)" if faster else "") + ".")


def wall_md(r, frame=None) -> str:
    return f"Wall time of this benchmark: {_fmt(r.meta.get('wall_seconds'), '.0f')} s.\n"


def prompts_md(r, frame=None) -> str:
    """The prompts (source, selection, the length rule's cuts and skips) and the tables (where they were built, how
    long it took)."""
    meta = r.meta
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
