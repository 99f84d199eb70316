"""Train/test standing of every policy kind: parameters chosen on the train split, figures on the test split.

The suite is split by prompt (``disco.suite.split_of``). For each kind, the setting with the best replay
geometric-mean speed-up on the train prompts is chosen, and its speed-up on the test prompts is reported
beside the test figures of the train-chosen best static K and best fixed threshold and of the oracle
(an upper bound, so no choice is involved). Nothing about a test prompt enters any choice.
"""

from __future__ import annotations

import math

import pandas as pd

from disco.bench.analysis import REFERENCE_SETTING, geomean
from disco.policies import AUTOREGRESSIVE, policy_kinds, spec_kind
from disco.policies.grids import CLASSIC_KINDS

COLUMNS = ["kind", "setting", "train_speedup", "test_speedup", "vs_best_static", "vs_best_threshold", "of_oracle"]


def split_speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """Replay geomean speed-up per strategy (rows) and split (columns ``train``, ``test``)."""
    rows = runs[(runs["mode"] == "replay")] if "mode" in runs else runs
    if rows.empty or "split" not in rows:
        return pd.DataFrame()
    table = rows.groupby(["strategy", "split"])["speedup"].apply(lambda s: geomean(s.astype(float))).unstack()
    return table if {"train", "test"} <= set(table.columns) else pd.DataFrame()


def holdout_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per kind (the oracle and the reference setting too); empty unless both splits were replayed."""
    sp = split_speedups(runs)
    if sp.empty:
        return pd.DataFrame(columns=COLUMNS)
    kinds = {s: spec_kind(s) for s in sp.index}
    chosen = {}
    for cls in policy_kinds():
        cands = sp.loc[[s for s in sp.index if kinds[s] == cls.kind], "train"].dropna()
        if cls.kind != AUTOREGRESSIVE and not cands.empty:
            chosen[cls.kind] = cands.idxmax()
    static, threshold, oracle = chosen.get("static"), chosen.get("threshold"), chosen.get("oracle")
    test = sp["test"]
    rows = []
    extra = [(f"{REFERENCE_SETTING} (fixed)", REFERENCE_SETTING)] if REFERENCE_SETTING in sp.index else []
    for label, spec in [(k, s) for k, s in chosen.items()] + extra:
        t = float(test.get(spec, math.nan))
        rows.append({
            "kind": label, "setting": spec, "train_speedup": float(sp.loc[spec, "train"]), "test_speedup": t,
            "vs_best_static": t / float(test[static]) if static else math.nan,
            "vs_best_threshold": t / float(test[threshold]) if threshold else math.nan,
            "of_oracle": t / float(test[oracle]) if oracle else math.nan,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def best_new(frame: pd.DataFrame) -> dict | None:
    """The new stopping rule (beyond the classic kinds) with the best *train* speed-up, and its test standing."""
    if frame.empty:
        return None
    new = frame[~frame["kind"].isin(CLASSIC_KINDS) & ~frame["kind"].str.endswith("(fixed)")]
    if new.empty:
        return None
    return new.sort_values("train_speedup", ascending=False).iloc[0].to_dict()


def holdout_md(frame: pd.DataFrame) -> str:
    """The markdown section of summary.md (empty when the runs do not hold both splits)."""
    if frame.empty:
        return ""
    fmt = lambda v: "—" if v is None or v != v else f"{v:.3f}"  # noqa: E731
    lines = ["## Train / test (parameters chosen on the train prompts, figures on the test prompts)", "",
             "| kind | setting (chosen on train) | train | test | test ÷ best static | test ÷ best threshold | "
             "test ÷ oracle |", "|---|---|---|---|---|---|---|"]
    for r in frame.to_dict("records"):
        lines.append(f"| {r['kind']} | `{r['setting']}` | {fmt(r['train_speedup'])}x | {fmt(r['test_speedup'])}x | "
                     f"{fmt(r['vs_best_static'])} | {fmt(r['vs_best_threshold'])} | {fmt(r['of_oracle'])} |")
    best = best_new(frame)
    if best:
        goals = [("≥ best static K + 10 %", best["vs_best_static"] >= 1.10),
                 ("≥ the best fixed threshold", best["vs_best_threshold"] >= 1.0),
                 ("≥ 95 % of the oracle", best["of_oracle"] >= 0.95)]
        lines += ["", f"Best new rule on train: **{best['kind']}** (`{best['setting']}`), test "
                  f"{fmt(best['test_speedup'])}x: " + "; ".join(f"{g}: {'met' if ok else 'not met'}" for g, ok in goals)
                  + "."]
    return "\n".join(lines) + "\n"
