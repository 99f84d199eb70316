"""Train/test standing of every policy kind: parameters chosen on the train split, figures on the test split.

The suite is split by prompt (``disco.suites.split_of``). For each kind, the setting with the best replay
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

LOOKUP_KINDS = tuple(cls.kind for cls in policy_kinds() if cls.proposes and not cls.uses_assistant)  # without a model
COLUMNS = ["kind", "setting", "train_speedup", "test_speedup", "vs_best_static", "vs_best_threshold", "of_oracle",
           "test_drafted"]


def split_speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """Replay geomean speed-up per strategy (rows) and split (columns ``train``, ``test``)."""
    rows = runs[(runs["mode"] == "replay")] if "mode" in runs else runs
    if rows.empty or "split" not in rows:
        return pd.DataFrame()
    table = rows.groupby(["strategy", "split"])["speedup"].apply(lambda s: geomean(s.astype(float))).unstack()
    return table if {"train", "test"} <= set(table.columns) else pd.DataFrame()


def _test_drafted(runs: pd.DataFrame) -> pd.Series:
    """Tokens each strategy drafted on the test prompts (0: it ran as the target alone there)."""
    rows = runs[(runs["mode"] == "replay") & (runs["split"] == "test")] if "mode" in runs else runs
    if rows.empty or "drafted" not in rows:
        return pd.Series(dtype=float)
    return rows.groupby("strategy")["drafted"].apply(lambda s: pd.to_numeric(s, errors="coerce").fillna(0).sum())


def holdout_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per kind (the oracle and the reference setting too); empty unless both splits were replayed."""
    sp = split_speedups(runs)
    if sp.empty:
        return pd.DataFrame(columns=COLUMNS)
    drafted = _test_drafted(runs)
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
            "test_drafted": float(drafted.get(spec, math.nan)),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def best_new(frame: pd.DataFrame) -> dict | None:
    """The new stopping rule with the best *train* speed-up, and its test standing. Only rules that speculate count:
    not the classic kinds, not the drafters without a model (prompt lookup chooses no draft length from the
    assistant), and not a setting that drafted nothing on the test prompts (it ran as the target alone)."""
    if frame.empty:
        return None
    drafted = frame["test_drafted"] if "test_drafted" in frame else pd.Series(1.0, index=frame.index)
    new = frame[~frame["kind"].isin(CLASSIC_KINDS) & ~frame["kind"].isin(LOOKUP_KINDS)
                & ~frame["kind"].str.endswith("(fixed)") & (drafted.fillna(1.0) > 0)]
    if new.empty:
        return None
    return new.sort_values("train_speedup", ascending=False).iloc[0].to_dict()


def verdicts(best: dict) -> list[tuple[str, bool]]:
    """The goals a new rule is held to, each met only by its own test figure, and never by a rule slower than the
    target alone (a share of the oracle or of the best static K says nothing when all of them lose)."""
    faster = best["test_speedup"] > 1.0
    return [("≥ best static K + 10 %", faster and best["vs_best_static"] >= 1.10),
            ("≥ the best fixed threshold", faster and best["vs_best_threshold"] >= 1.0),
            ("≥ 95 % of the oracle", faster and best["of_oracle"] >= 0.95)]


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
        lines += ["", f"Best new rule on train (rules that speculate): **{best['kind']}** (`{best['setting']}`), test "
                  f"{fmt(best['test_speedup'])}x: "
                  + "; ".join(f"{g}: {'met' if ok else 'not met'}" for g, ok in verdicts(best))
                  + (" (slower than the target alone: no goal is met)" if best["test_speedup"] <= 1.0 else "") + "."]
    return "\n".join(lines) + "\n"


COPY_PROMPTS = "copy"              # the suite's kind of prompt whose answers copy the prompt
LOOKUP_GOAL = 1.3                  # issue 18: a lookup lane beats the target alone by 1.3x on the copy prompts' test split


def kind_holdout(runs: pd.DataFrame, prompt_kind: str = COPY_PROMPTS) -> pd.DataFrame:
    """On one kind of prompt only: for each kind of policy, the setting with the best replay speed-up on that kind's
    train prompts, and its speed-up on that kind's test prompts and on the other kinds' test prompts (empty unless
    both splits of the kind were replayed)."""
    rows = runs[(runs["mode"] == "replay")] if "mode" in runs else runs
    if rows.empty or "kind" not in rows or prompt_kind not in set(rows["kind"]):
        return pd.DataFrame(columns=["kind", "setting", "train", "test", "other_test"])
    own = split_speedups(rows[rows["kind"] == prompt_kind])
    other = rows[(rows["kind"] != prompt_kind) & (rows["split"] == "test")]
    other_test = other.groupby("strategy")["speedup"].apply(lambda s: geomean(s.astype(float))) if not other.empty \
        else pd.Series(dtype=float)
    if own.empty:
        return pd.DataFrame(columns=["kind", "setting", "train", "test", "other_test"])
    kinds = {s: spec_kind(s) for s in own.index}
    out = []
    for cls in policy_kinds():
        cands = own.loc[[s for s in own.index if kinds[s] == cls.kind], "train"].dropna()
        if cls.kind == AUTOREGRESSIVE or cands.empty:
            continue
        spec = cands.idxmax()
        out.append({"kind": cls.kind, "setting": spec, "train": float(own.loc[spec, "train"]),
                    "test": float(own.loc[spec, "test"]), "other_test": float(other_test.get(spec, math.nan))})
    return pd.DataFrame(out).sort_values("test", ascending=False, ignore_index=True)


def kind_holdout_md(frame: pd.DataFrame, prompt_kind: str = COPY_PROMPTS) -> str:
    if frame.empty:
        return ""
    fmt = lambda v: "—" if v is None or v != v else f"{v:.2f}x"  # noqa: E731
    lines = [f"## Prompt lookup on the {prompt_kind} prompts (chosen on their train split, shown on their test split)",
             "", f"| kind | setting (chosen on the {prompt_kind} train prompts) | train | test | other kinds' test prompts |",
             "|---|---|---|---|---|"]
    for r in frame.to_dict("records"):
        mark = " ◀" if r["kind"] in LOOKUP_KINDS else ""
        lines.append(f"| {r['kind']}{mark} | `{r['setting']}` | {fmt(r['train'])} | {fmt(r['test'])} | "
                     f"{fmt(r['other_test'])} |")
    lookup = frame[frame["kind"].isin(LOOKUP_KINDS)]
    if not lookup.empty:
        best = lookup.iloc[0]
        met = "met" if best["test"] >= LOOKUP_GOAL else "not met"
        lines += ["", f"Best drafter without a model on the {prompt_kind} test prompts: `{best['setting']}` "
                  f"{fmt(best['test'])} (goal ≥ {LOOKUP_GOAL}x: {met}); on the other kinds' test prompts "
                  f"{fmt(best['other_test'])}."]
    return "\n".join(lines) + "\n"
