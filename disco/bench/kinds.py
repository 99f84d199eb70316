"""The seed's question answered per kind of prompt (a benchmark's categories), under the run's cost profile.

``kind_answer``: per kind and over all prompts, from replay: ``threshold:0.4:20`` as a share of the kind's best
threshold and of its best static K, the best dynamic rule against the best static K, and the oracle. "Best" is in
hindsight on that kind's own prompts (an upper bound on what tuning per kind could give).

``leave_one_kind_out``: for each kind held out, each family's setting is chosen on the *other* kinds' prompts and its
speed-up reported on the held kind, beside that kind's own best of the family (in hindsight): does a setting tuned
on some categories carry over to another? No model runs: both are read from the replay rows.

Families: ``static`` (static K), ``threshold`` (transformers' fixed τ), ``dynamic`` (every rule that chooses the
assistant's draft length per iteration: heuristic, threshold, adaptive, entropy, cumulative, costaware, disco, pmin;
prompt lookup drafts without the assistant and is left out), and the
fixed ``threshold:0.4:20`` (no choice). A setting counts only where it drafted on the prompts in question (a rule
that drafts nothing is the target alone, not a speculation setting).
"""

from __future__ import annotations

import math

import pandas as pd

from disco.bench.analysis import REFERENCE_SETTING, geomean
from disco.policies import policy_kinds, spec_kind

# the baseline, fixed-length drafting, the bound, and the drafters without a model (prompt lookup: what they copy, not
# a stopping rule on the assistant's draft, decides their length)
NOT_DYNAMIC = {"autoregressive", "static", "oracle"} | {cls.kind for cls in policy_kinds() if cls.proposes}  # hybrid too
FAMILIES = {"static": lambda kind: kind == "static", "threshold": lambda kind: kind == "threshold",
            "dynamic": lambda kind: kind not in NOT_DYNAMIC}
ALL = "all"


def per_setting(rows: pd.DataFrame) -> pd.DataFrame:
    """Geomean speed-up and total drafted tokens per strategy over ``rows`` (replay rows of some prompts)."""
    if rows.empty:
        return pd.DataFrame(columns=["speedup", "drafted", "family_kind"])
    grouped = rows.groupby("strategy", sort=False)
    frame = pd.DataFrame({"speedup": grouped["speedup"].apply(lambda s: geomean(s.astype(float))),
                          "drafted": grouped["drafted"].apply(lambda s: pd.to_numeric(s, errors="coerce").fillna(0).sum())})
    frame["family_kind"] = [spec_kind(s) for s in frame.index]
    return frame


def _best(frame: pd.DataFrame, family: str) -> tuple[str | None, float]:
    """The family's best setting that drafted, and its speed-up (None, nan when it has none)."""
    if frame.empty:
        return None, math.nan
    member = frame["family_kind"].map(FAMILIES[family]).astype(bool)
    cands = frame[member & (frame["drafted"] > 0)]["speedup"].dropna()
    return (cands.idxmax(), float(cands.max())) if not cands.empty else (None, math.nan)


def _replay(runs: pd.DataFrame) -> pd.DataFrame:
    if runs.empty or "mode" not in runs:
        return pd.DataFrame()
    return runs[runs["mode"] == "replay"]


def kind_slice(summary: pd.DataFrame, kind: str) -> pd.DataFrame:
    """A summary (``disco.bench.analysis.summarize_runs``) as if ``kind``'s prompts were all there is, so every view of
    the whole (the heatmap, the best settings) draws one kind."""
    if summary.empty or kind == ALL or "kind" not in summary:
        return summary
    return summary[summary["kind"] == kind].assign(kind=ALL)


def kinds_in(runs: pd.DataFrame) -> list[str]:
    rows = _replay(runs)
    return list(dict.fromkeys(rows["kind"])) if not rows.empty else []


def kind_answer(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per kind (and ``all``): the reference setting against each kind's best (module doc)."""
    rows = _replay(runs)
    out = []
    for kind in ([ALL] + kinds_in(runs)) if not rows.empty else []:
        part = rows if kind == ALL else rows[rows["kind"] == kind]
        frame = per_setting(part)
        ref = float(frame["speedup"].get(REFERENCE_SETTING, math.nan))
        static, static_sp = _best(frame, "static")
        thr, thr_sp = _best(frame, "threshold")
        dyn, dyn_sp = _best(frame, "dynamic")
        oracles = frame[frame["family_kind"] == "oracle"]["speedup"].dropna()
        out.append({"kind": kind, "prompts": int(part["prompt_id"].nunique()), "reference": ref,
                    "best_threshold": thr, "best_threshold_speedup": thr_sp, "reference_of_best_threshold": ref / thr_sp,
                    "best_static": static, "best_static_speedup": static_sp, "reference_of_best_static": ref / static_sp,
                    "best_dynamic": dyn, "best_dynamic_speedup": dyn_sp, "dynamic_over_static": dyn_sp / static_sp,
                    "oracle_speedup": float(oracles.max()) if not oracles.empty else math.nan})
    return pd.DataFrame(out)


def leave_one_kind_out(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per held kind and family: the setting chosen on the other kinds, its speed-up on the held kind, and
    the held kind's own best of the family (module doc). Empty with fewer than two kinds."""
    rows = _replay(runs)
    kinds = kinds_in(runs)
    if len(kinds) < 2:
        return pd.DataFrame()
    out = []
    for held in kinds:
        own = per_setting(rows[rows["kind"] == held])
        others = per_setting(rows[rows["kind"] != held])
        for family in FAMILIES:
            chosen, chosen_sp = _best(others, family)
            hindsight, hindsight_sp = _best(own, family)
            value = float(own["speedup"].get(chosen, math.nan)) if chosen else math.nan
            out.append({"held_kind": held, "family": family, "chosen_on_others": chosen, "others_speedup": chosen_sp,
                        "held_speedup": value, "held_best": hindsight, "held_best_speedup": hindsight_sp,
                        "of_held_best": value / hindsight_sp})
        ref = float(own["speedup"].get(REFERENCE_SETTING, math.nan))
        _, best_thr = _best(own, "threshold")
        out.append({"held_kind": held, "family": "fixed", "chosen_on_others": REFERENCE_SETTING,
                    "others_speedup": float(others["speedup"].get(REFERENCE_SETTING, math.nan)), "held_speedup": ref,
                    "held_best": None, "held_best_speedup": best_thr, "of_held_best": ref / best_thr})
    return pd.DataFrame(out)


def speedup_text(value, digits: str = ".2f") -> str:
    return "—" if value is None or value != value else f"{value:{digits}}x"


def _pct(value) -> str:
    return "—" if value is None or value != value else f"{100 * value:.0f} %"


def kind_answer_md(frame: pd.DataFrame, cost_words: str) -> str:
    if frame.empty:
        return ""
    lines = [f"## The seed's question per kind of prompt (replay, {cost_words})", "",
             f"| kind | prompts | `{REFERENCE_SETTING}` | best threshold | its share | best static K | its share | "
             "best dynamic rule | ÷ best static | oracle |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.to_dict("records"):
        lines.append(f"| {r['kind']} | {r['prompts']} | {speedup_text(r['reference'])} | `{r['best_threshold']}` "
                     f"{speedup_text(r['best_threshold_speedup'])} | {_pct(r['reference_of_best_threshold'])} | "
                     f"`{r['best_static']}` {speedup_text(r['best_static_speedup'])} | {_pct(r['reference_of_best_static'])} | "
                     f"`{r['best_dynamic']}` {speedup_text(r['best_dynamic_speedup'])} | {speedup_text(r['dynamic_over_static'], '.3f')} | "
                     f"{speedup_text(r['oracle_speedup'])} |")
    lines += ["", f"\"Its share\": `{REFERENCE_SETTING}`'s speed-up over the kind's best threshold (or best static K), "
              "each chosen in hindsight on that kind's prompts; the best dynamic rule is the best setting of any rule "
              "that chooses the assistant's draft length per iteration (prompt lookup aside). Geometric means over "
              "the kind's prompts."]
    return "\n".join(lines) + "\n"


def leave_one_kind_out_md(frame: pd.DataFrame) -> str:
    if frame.empty:
        return ""
    kinds = list(dict.fromkeys(frame["held_kind"]))
    labels = {"static": "best static K", "threshold": "best threshold", "dynamic": "best dynamic rule",
              "fixed": f"`{REFERENCE_SETTING}` (fixed)"}
    lines = ["## Each kind held out (settings chosen on the other kinds, reported on the held one)", "",
             "| chosen on the other kinds | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for family, label in labels.items():
        cells = []
        for kind in kinds:
            r = frame[(frame["held_kind"] == kind) & (frame["family"] == family)]
            if r.empty:
                cells.append("—")
                continue
            r = r.iloc[0]
            chosen = f" `{r['chosen_on_others']}`" if family != "fixed" and r["chosen_on_others"] else ""
            cells.append(f"{speedup_text(r['held_speedup'])}{chosen}, {_pct(r['of_held_best'])}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: the speed-up on the held kind's prompts of the setting chosen on all other kinds' prompts, "
              "and its share of the held kind's own best setting of that family (in hindsight; for the fixed setting: "
              "of the held kind's best threshold)."]
    return "\n".join(lines) + "\n"
