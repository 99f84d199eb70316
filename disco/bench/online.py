"""The online bandit's regret: per prompt, the bandit lane against the best of its own arms in hindsight.

A ``bandit:KMAX`` lane plays arms that are settings of their own (static K, ``threshold:τ:KMAX``); the replay grid
holds each of them as a lane, so for every prompt the best arm in hindsight is known exactly, and so is the single
arm that would have been best over all the prompts. Regret = 1 − (the bandit's speed-up ÷ that arm's).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from disco.policies import canonical_spec, parse_strategy


def arm_specs(spec: str) -> list[str]:
    """The lanes that play a bandit's arms on their own (``static:K``, ``threshold:TAU:KMAX``)."""
    policy = parse_strategy(spec.partition("@")[0])
    return [canonical_spec("static", k=k) if tau == 0 else canonical_spec("threshold", tau=tau, k=k)
            for k, tau in policy.arms]


def _geomean(values) -> float:
    values = [v for v in values if v == v and v > 0]
    return float(np.exp(np.mean(np.log(values)))) if values else math.nan


def regret_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per bandit lane and prompt: its speed-up, the best arm's on that prompt, the arm best over all the
    prompts (in hindsight) and its speed-up there, and both regrets."""
    if runs.empty or "mode" not in runs:
        return pd.DataFrame()
    replay = runs[(runs["mode"] == "replay") & (runs["implementation"] == "ours")]
    bandits = sorted(s for s in replay["strategy"].unique() if str(s).startswith("bandit:"))
    rows = []
    for spec in bandits:
        arms = arm_specs(spec)
        table = replay[replay["strategy"].isin(arms + [spec])].pivot_table(
            index="prompt_id", columns="strategy", values="speedup", aggfunc="first")
        present = [a for a in arms if a in table]
        if spec not in table or not present:
            continue
        overall = max(present, key=lambda a: _geomean(table[a]))
        kinds = replay.drop_duplicates("prompt_id").set_index("prompt_id")["kind"]
        for prompt, row in table.iterrows():
            best = max(present, key=lambda a: row[a] if row[a] == row[a] else -1)
            rows.append({"strategy": spec, "prompt_id": prompt, "kind": kinds.get(prompt, ""),
                         "speedup": row[spec], "best_arm": best, "best_arm_speedup": row[best],
                         "regret_vs_prompt_best": 1 - row[spec] / row[best],
                         "overall_arm": overall, "overall_arm_speedup": row[overall],
                         "regret_vs_overall_arm": 1 - row[spec] / row[overall]})
    return pd.DataFrame(rows)


def regret_md(frame: pd.DataFrame) -> str:
    """The report's section: per bandit lane, its geometric-mean speed-up against its best single arm in hindsight,
    and the spread of its regret per prompt."""
    lines = ["## Online bandit: regret against its own arms",
             "Per prompt, the bandit lane against the best of its arms on that prompt and against the one arm that was "
             "best over all the prompts (both in hindsight, replayed on the same tables); regret = 1 − bandit ÷ arm "
             "(regret.csv has every prompt).", "",
             "| lane | prompts | speed-up (geomean) | best single arm | its speed-up | bandit ÷ arm | regret per prompt vs "
             "that prompt's best arm (median, max) |", "|---|---|---|---|---|---|---|"]
    for spec, part in frame.groupby("strategy", sort=False):
        ours, arm = _geomean(part["speedup"]), _geomean(part["overall_arm_speedup"])
        lines.append(f"| `{spec}` | {len(part)} | {ours:.2f}x | `{part['overall_arm'].iloc[0]}` | {arm:.2f}x | "
                     f"{ours / arm:.3f} | {100 * part['regret_vs_prompt_best'].median():.1f} %, "
                     f"{100 * part['regret_vs_prompt_best'].max():.1f} % |")
    return "\n".join(lines)
