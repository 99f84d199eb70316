"""The benchmark's acceptance by draft position: every replayed drafting iteration pooled per strategy, over all
prompts and per kind of prompt (``positions.csv``), and the report's table for the settings it headlines.

Replay is exact for greedy decoding, so these are the counts a live greedy run makes (``position_acceptance`` is
the same function the Race tab plots).
"""

from __future__ import annotations

import pandas as pd

from disco.decode.trace import position_acceptance

COLUMNS = ["strategy", "kind", "position", "reached", "accepted", "rate"]
SHOWN = 8  # positions in the report's table (positions.csv has all)


def positions_frame(drafts: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and kind of prompt (``all`` pooled), per draft position: reached, accepted, rate."""
    if drafts is None or drafts.empty:
        return pd.DataFrame(columns=COLUMNS)
    parts = []
    for kind, rows in [("all", drafts), *drafts.groupby("kind", sort=False)]:
        table = position_acceptance(rows)
        table.insert(1, "kind", kind)
        parts.append(table)
    return pd.concat(parts, ignore_index=True)[COLUMNS]


def positions_md(frame: pd.DataFrame, strategies: list[str], kinds: tuple[str, ...] = ("all",)) -> str:
    """A markdown table: one row per strategy (and kind), the conditional acceptance of positions 1..SHOWN with the
    number of drafts that reached each."""
    rows = frame[frame["strategy"].isin(strategies) & frame["kind"].isin(kinds)] if not frame.empty else frame
    if rows.empty:
        return ""
    width = min(SHOWN, int(rows["position"].max()))
    header = "| strategy | prompts | " + " | ".join(f"pos {i}" for i in range(1, width + 1)) + " |"
    lines = ["## Acceptance by draft position (replay)", "",
             "P(position i accepted | positions 1..i−1 accepted), with the number of drafts that reached position i; "
             "all positions in `positions.csv`.", "", header, "|---|---|" + "---|" * width]
    for spec in strategies:
        for kind in kinds:
            r = rows[(rows["strategy"] == spec) & (rows["kind"] == kind)].set_index("position")
            if r.empty:
                continue
            cells = [f"{r.loc[i, 'rate']:.2f} ({int(r.loc[i, 'reached'])})" if i in r.index else "—"
                     for i in range(1, width + 1)]
            lines.append(f"| `{spec}` | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
