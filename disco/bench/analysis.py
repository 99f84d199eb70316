"""Analysis of the runs table: geometric-mean speed-ups, best settings, theory beside measurement, replay
validated against timed runs, ours against the peer."""

from __future__ import annotations

import math
from typing import Iterable

import pandas as pd

from disco import theory
from disco.bench.llama_peer import PREFIX as LLAMA_PREFIX
from disco.bench.peer import PEER_PREFIX
from disco.costs.model import QUIET_TOLERANCE, CostModel
from disco.policies import AUTOREGRESSIVE, REFERENCE as REFERENCE_SETTING, policy_kinds, spec_kind

TIME_TOLERANCE = 0.15  # predicted vs measured seconds, per strategy summed over the timed prompts
POLICY_COLUMNS = ("policy_kind", "tau", "kmax")  # a setting's kind and parameters (disco.bench.runs.policy_columns)


def geomean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and v == v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def add_decode_speedup(runs: pd.DataFrame) -> pd.DataFrame:
    """decode_speedup: the speed-up of the decode loop alone (prefill, i.e. iteration 1, excluded), against
    the autoregressive run of the same prompt, mode and implementation (NaN for the peer: not measurable)."""
    if runs.empty or "decode_seconds" not in runs:
        return runs
    runs = runs.copy()
    is_ar = runs["strategy"].isin([AUTOREGRESSIVE, PEER_PREFIX + AUTOREGRESSIVE, LLAMA_PREFIX + AUTOREGRESSIVE])
    base = runs[is_ar].set_index(["mode", "implementation", "prompt_id"])["decode_seconds"]
    keys = list(zip(runs["mode"], runs["implementation"], runs["prompt_id"]))
    ar = pd.Series([base.get(k, math.nan) for k in keys], index=runs.index, dtype=float)
    runs["decode_speedup"] = ar / pd.to_numeric(runs["decode_seconds"], errors="coerce")
    return runs


def _divergence_counts(rows: pd.DataFrame) -> str:
    """``near-tie 2, mismatch 0``-style counts of the explained divergences among ``rows`` ('' when none)."""
    if "divergence" not in rows:
        return ""
    kinds = rows["divergence"].dropna().astype(str)
    counts = kinds[kinds != ""].value_counts()
    return ", ".join(f"{k} {n}" for k, n in counts.items())


def summarize_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mode x strategy x kind ("all" + each kind): geometric-mean speed-up with its spread."""
    out = []
    if runs.empty:
        return pd.DataFrame()
    runs = add_decode_speedup(runs)
    for (mode, strategy), group in runs.groupby(["mode", "strategy"], sort=False):
        for kind, rows in [("all", group)] + list(group.groupby("kind", sort=True)):
            sp = rows["speedup"].astype(float)
            ident = rows["identical_to_autoregressive"]
            out.append({
                "mode": mode, "strategy": strategy, "implementation": rows["implementation"].iloc[0], "kind": kind,
                "prompts": len(rows), "speedup_geomean": geomean(sp), "speedup_min": sp.min(), "speedup_max": sp.max(),
                "decode_speedup_geomean": geomean(rows["decode_speedup"].astype(float)),
                "seconds_total": float(rows["seconds"].sum()), "new_tokens_total": int(rows["new_tokens"].sum()),
                "target_passes_total": int(rows["target_passes"].sum()),
                "assistant_passes_total": int(pd.to_numeric(rows["assistant_passes"], errors="coerce").fillna(0).sum()),
                "acceptance_rate_mean": float(pd.to_numeric(rows["acceptance_rate"], errors="coerce").mean()),
                "mean_lookahead_mean": float(pd.to_numeric(rows["mean_lookahead"], errors="coerce").mean()),
                "all_identical": bool(ident.dropna().astype(bool).all()) if ident.notna().any() else None,
                "divergences": _divergence_counts(rows),
                "overhead_pct_mean": float(pd.to_numeric(rows["overhead_pct"], errors="coerce").mean()),
                **{c: rows[c].iloc[0] for c in POLICY_COLUMNS if c in rows},
            })
    return pd.DataFrame(out)


def overall_rows(summary: pd.DataFrame, mode: str = "replay") -> pd.DataFrame:
    if summary.empty:
        return summary
    return summary[(summary["mode"] == mode) & (summary["kind"] == "all")].set_index("strategy")


def best_settings(summary: pd.DataFrame, column: str = "speedup_geomean") -> dict:
    """The best static K, the best threshold setting and friends, from replay's overall geomean speed-ups."""
    overall = overall_rows(summary)
    if overall.empty or column not in overall:
        return {}
    sp = overall[column]
    kinds = {s: spec_kind(s) for s in sp.index}
    def best(kind):
        cands = sp[[s for s in sp.index if kinds[s] == kind]].dropna()
        return (cands.idxmax(), float(cands.max())) if not cands.empty else (None, math.nan)
    out = {}
    for kind in [cls.kind for cls in policy_kinds() if cls.kind != AUTOREGRESSIVE]:
        spec, value = best(kind)
        if spec is None and kind not in ("static", "threshold", "heuristic", "oracle"):
            continue  # a kind this grid did not hold
        out[f"best_{kind}"], out[f"best_{kind}_speedup"] = spec, value
    out["reference"] = REFERENCE_SETTING
    out["reference_speedup"] = float(sp.get(REFERENCE_SETTING, math.nan))
    return out


def theory_frame(alpha: float, c: float, costs: CostModel | None, summary: pd.DataFrame,
                 ks: Iterable[int] = range(1, 21)) -> pd.DataFrame:
    """Leviathan et al.'s predicted speed-up per static K beside replay's (measured-cost) answer.

    ``theory_speedup`` assumes verifying k+1 tokens costs one target step; the second column uses the
    measured verification cost t_target(k+1) instead, which matters on CPUs where it grows with k.
    """
    overall = overall_rows(summary)
    rows = []
    for k in ks:
        tokens = theory.expected_tokens(alpha, k)
        cost_aware = math.nan
        if costs is not None:
            t1 = costs.target_ms(1)
            cost_aware = tokens * t1 / (k * costs.assistant_ms(1) + costs.target_ms(k + 1))
        spec = f"static:{k}"
        rows.append({"K": k, "alpha": alpha, "c": c, "theory_tokens_per_iteration": tokens,
                     "theory_speedup": theory.speedup(alpha, k, c), "theory_speedup_measured_verify": cost_aware,
                     "replay_speedup": float(overall["speedup_geomean"].get(spec, math.nan)) if not overall.empty else math.nan})
    return pd.DataFrame(rows)


def validation_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """For every timed run of ours: replay's prediction beside the measurement."""
    timed = runs[(runs["mode"] == "timed") & (runs["implementation"] == "ours")]
    rep = runs[runs["mode"] == "replay"].set_index(["prompt_id", "strategy"])
    rows = []
    for _, t in timed.iterrows():
        key = (t["prompt_id"], t["strategy"])
        if key not in rep.index:
            continue
        p = rep.loc[key]
        rows.append({
            "prompt_id": t["prompt_id"], "strategy": t["strategy"],
            "iterations_predicted": int(p["iterations"]), "iterations_measured": int(t["iterations"]),
            "target_passes_predicted": int(p["target_passes"]), "target_passes_measured": int(t["target_passes"]),
            "assistant_passes_predicted": int(p["assistant_passes"]), "assistant_passes_measured": int(t["assistant_passes"]),
            "seconds_predicted": float(p["seconds"]), "seconds_measured": float(t["seconds"]),
            "time_error_pct": 100.0 * (float(p["seconds"]) - float(t["seconds"])) / float(t["seconds"]),
            "exact": int(p["iterations"]) == int(t["iterations"]) and int(p["target_passes"]) == int(t["target_passes"]),
            "identical_to_autoregressive": t["identical_to_autoregressive"],
            "divergence": t.get("divergence_detail", "") if isinstance(t.get("divergence_detail", ""), str) else "",
        })
    return pd.DataFrame(rows)


def validation_outcome(val: pd.DataFrame) -> dict:
    if val.empty:
        return {"checked": 0}
    per = val.groupby("strategy")[["seconds_predicted", "seconds_measured"]].sum()
    err = 100.0 * (per["seconds_predicted"] - per["seconds_measured"]) / per["seconds_measured"]
    total_err = 100.0 * (val["seconds_predicted"].sum() - val["seconds_measured"].sum()) / val["seconds_measured"].sum()
    return {
        "checked": len(val), "exact": int(val["exact"].sum()),
        "exact_assistant": int((val["assistant_passes_predicted"] == val["assistant_passes_measured"]).sum()),
        "time_error_pct_by_strategy": {k: round(float(v), 2) for k, v in err.items()},
        "time_error_pct_total": round(float(total_err), 2),
        "time_error_pct_rows_median_abs": round(float(val["time_error_pct"].abs().median()), 2),
        "tolerance_pct": 100 * TIME_TOLERANCE,
        "counts_ok": bool(val["exact"].all()),
        "time_ok": bool((err.abs() <= 100 * TIME_TOLERANCE).all()),
        "passed": bool(val["exact"].all() and (err.abs() <= 100 * TIME_TOLERANCE).all()),
    }


def quiet_outcome(runs: pd.DataFrame) -> dict:
    """How many timed runs of ours kept to this machine's quiet pass costs (``live_over_quiet`` within 10 %)."""
    if runs.empty or "live_over_quiet" not in runs:
        return {"checked": 0}
    ratio = pd.to_numeric(runs.loc[(runs["mode"] == "timed") & (runs["implementation"] == "ours"), "live_over_quiet"],
                          errors="coerce").dropna()
    if ratio.empty:
        return {"checked": 0}
    return {"checked": int(len(ratio)), "busy": int((ratio - 1 > QUIET_TOLERANCE).sum()),
            "faster": int((1 - ratio > QUIET_TOLERANCE).sum()), "median": float(ratio.median()),
            "worst": float(ratio.iloc[(ratio - 1).abs().argmax()])}


def peer_frame(summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Ours against the engine's peer on the same settings (timed prompts only): transformers' generate (whole calls)
    or llama.cpp's own programs (the decode phase: its rate, as seconds for the same number of tokens)."""
    timed = runs[runs["mode"] == "timed"]
    rows = []
    for spec in timed.loc[timed["implementation"] == "ours", "strategy"].unique():
        ours = timed[(timed["strategy"] == spec) & (timed["implementation"] == "ours")]
        hf = timed[timed["strategy"] == PEER_PREFIX + spec]
        llama = hf.empty
        if llama:
            hf = timed[timed["strategy"] == LLAMA_PREFIX + spec]
            if hf.empty:
                continue
            ours = ours.copy()  # the decode phase, at our decode rate, for the same number of tokens
            ours["seconds"] = ours["new_tokens"] / pd.to_numeric(ours["decode_tokens_per_s"], errors="coerce")
        merged = ours.merge(hf, on="prompt_id", suffixes=("_ours", "_hf"))
        rows.append({
            "strategy": spec, "prompts": len(merged),
            "seconds_ours": float(merged["seconds_ours"].sum()), "seconds_hf": float(merged["seconds_hf"].sum()),
            "ratio_ours_over_hf": float(merged["seconds_ours"].sum() / merged["seconds_hf"].sum()),
            "ratio_median_per_prompt": float((merged["seconds_ours"] / merged["seconds_hf"]).median()),
            "speedup_ours": geomean(merged["speedup_ours"]), "speedup_hf": geomean(merged["speedup_hf"]),
            "peer": "llama.cpp" if llama else "transformers",
            # llama-bench writes no text and llama.cpp's programs count no passes: None where nothing was compared
            "same_text": (bool(merged["same_as_ours_hf"].dropna().astype(bool).all())
                          if merged["same_as_ours_hf"].notna().any() else None),
            "equal_target_passes": (bool((merged["target_passes_ours"] == merged["target_passes_hf"]).all())
                                    if merged["target_passes_hf"].notna().all() else None),
            "target_passes_ours": int(merged["target_passes_ours"].sum()),
            "target_passes_hf": (int(merged["target_passes_hf"].sum()) if merged["target_passes_hf"].notna().all()
                                 else None),
            "overhead_pct_ours": float(pd.to_numeric(merged["overhead_pct_ours"], errors="coerce").mean()),
            **(_llama_statistics(merged) if llama else {}),
        })
    return pd.DataFrame(rows)


def _llama_statistics(merged: pd.DataFrame) -> dict:
    """llama-speculative-simple's closing statistics beside ours under its own definitions
    (``disco.decode.acceptance.llamacpp``: n_drafted = draft tokens sent to the target, n_accept = those it kept,
    accept = 100 * n_accept / n_drafted), summed over the prompts where the peer printed them; {} for llama-bench's
    plain decoding, which drafts nothing."""
    if "drafted_hf" not in merged or "accepted_hf" not in merged:
        return {}
    printed = (pd.to_numeric(merged["drafted_hf"], errors="coerce").notna()
               & pd.to_numeric(merged["accepted_hf"], errors="coerce").notna())
    if not printed.any():
        return {}
    both = merged[printed]
    out = {"llamacpp_prompts": int(len(both))}
    for side in ("ours", "hf"):
        drafted = int(pd.to_numeric(both[f"drafted_{side}"], errors="coerce").fillna(0).sum())
        accepted = int(pd.to_numeric(both[f"accepted_{side}"], errors="coerce").fillna(0).sum())
        name = "peer" if side == "hf" else "ours"
        out |= {f"llamacpp_n_drafted_{name}": drafted, f"llamacpp_n_accept_{name}": accepted,
                f"llamacpp_accept_pct_{name}": 100.0 * accepted / drafted if drafted else math.nan}
    out["llamacpp_same_counts"] = (out["llamacpp_n_drafted_ours"] == out["llamacpp_n_drafted_peer"]
                                   and out["llamacpp_n_accept_ours"] == out["llamacpp_n_accept_peer"])
    return out


def engine_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Each of our timed settings against the engines' plain decoding of the same target, per prompt then geomean:
    llama.cpp's own (``llama:autoregressive``, llama-bench's decode rate) and the other engine's target alone
    (``ENGINE:autoregressive`` rows of ``bench --other-engine``). Decode rates leave out the prefill (llama-bench
    has none); whole-run ratios include it. Empty when the run timed neither."""
    timed = runs[runs["mode"] == "timed"] if not runs.empty else runs
    if timed.empty:
        return pd.DataFrame()
    ours = timed[timed["implementation"] == "ours"]
    plain = timed[timed["strategy"] == LLAMA_PREFIX + AUTOREGRESSIVE].set_index("prompt_id")
    other = timed[~timed["implementation"].isin(["ours", "hf", "llama.cpp"])
                  & timed["strategy"].str.endswith(":" + AUTOREGRESSIVE)]
    engine = str(other["implementation"].iloc[0]) if not other.empty else None
    other = other.set_index("prompt_id")
    if plain.empty and other.empty:
        return pd.DataFrame()
    num = lambda col: pd.to_numeric(col, errors="coerce")  # noqa: E731
    rows = []
    for spec, part in ours.groupby("strategy", sort=False):
        part = part.set_index("prompt_id")
        rate = num(part["decode_tokens_per_s"])
        row = {"strategy": spec, "prompts": len(part), "decode_tokens_per_s": geomean(rate),
               "tokens_per_s": geomean(part["new_tokens"] / num(part["seconds"]))}
        if not plain.empty:
            shared = part.index.intersection(plain.index)
            row["llama_plain_tokens_per_s"] = geomean(num(plain.loc[shared, "decode_tokens_per_s"]))
            row["decode_vs_llama_plain"] = geomean(rate[shared] / num(plain.loc[shared, "decode_tokens_per_s"]))
        if engine is not None:
            shared = part.index.intersection(other.index)
            o = other.loc[shared]
            row["other_engine"] = engine
            row["other_tokens_per_s"] = geomean(o["new_tokens"] / num(o["seconds"]))
            row["vs_other_engine"] = geomean((part.loc[shared, "new_tokens"] / num(part.loc[shared, "seconds"]))
                                             / (o["new_tokens"] / num(o["seconds"])))
            row["decode_vs_other_engine"] = geomean(rate[shared] / num(o["decode_tokens_per_s"]))
        rows.append(row)
    return pd.DataFrame(rows)
