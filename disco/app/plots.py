"""Plotly figures built from the trace (pure functions: DataFrame in, Figure out).

Every figure reads only the per-iteration frame (``Snapshot.iterations()`` or its CSV), so the same
plots can be rebuilt offline from a downloaded trace. One colour per strategy everywhere
(``strategy_color``), so a lane is recognisable across the race, the lookahead, the latency and
the confidence plots, and in the benchmark heatmap.

Figures are assembled as plain dicts and validated once (``go.Figure(data, layout)``): plotly's
incremental API (``add_trace``/``update_layout``/``make_subplots``) is ~5x slower, and the app
rebuilds four figures several times a second while a race runs.
"""

from __future__ import annotations

import colorsys
import math
import zlib

import pandas as pd
import plotly.graph_objects as go

from disco.decode.trace import STOP_CONFIDENCE, STOP_NONE, parse_confidences, position_acceptance
from disco.policies import policy_kinds, spec_kind

# Okabe-Ito, colour-blind safe. One hue per kind of policy (each policy class declares its own: disco.policies);
# variants of a kind get shades of it, the kind's canonical spec (static:5, threshold:0.4:20, ...) its pure hue.
KIND_COLORS = {cls.kind: cls.color for cls in policy_kinds()}
OTHER_COLORS = ("#e69f00", "#56b4e9", "#8c6d31", "#000000")  # for kinds no class declares (an old trace)
CANONICAL = tuple(cls.canonical for cls in policy_kinds())
FONT = "Inter, ui-sans-serif, system-ui, -apple-system, Segoe UI, Roboto, sans-serif"
HEIGHT = 380
_GRID = "#e8edf3"
_AXIS = dict(gridcolor=_GRID, linecolor="#cbd5e1", zerolinecolor=_GRID, zerolinewidth=1.5, ticks="", automargin=True,
             title=dict(standoff=8))
# a small layout-only look (like plotly_white): applying a built-in template costs ~70 ms per figure
TEMPLATE = go.layout.Template(layout=dict(
    paper_bgcolor="white", plot_bgcolor="white", font=dict(family=FONT, size=12, color="#1f2937"),
    hovermode="closest", xaxis=_AXIS, yaxis=_AXIS, colorway=list(KIND_COLORS.values()) + list(OTHER_COLORS),
    hoverlabel=dict(font=dict(family=FONT)),
))


def _shade(hex_color: str, amount: float) -> str:
    """Lighten (amount > 0, towards white) or darken (amount < 0, towards black) a #rrggbb colour."""
    r, g, b = (int(hex_color[i:i + 2], 16) / 255.0 for i in (1, 3, 5))
    h, l, s = colorsys.rgb_to_hls(r, g, b)
    l = l + amount * (1.0 - l) if amount > 0 else l * (1.0 + amount)
    r, g, b = colorsys.hls_to_rgb(h, min(1.0, max(0.0, l)), s)
    return "#{:02x}{:02x}{:02x}".format(round(r * 255), round(g * 255), round(b * 255))


def strategy_color(strategy: str) -> str:
    """The colour of a strategy spec, stable across figures, runs and processes.

    The canonical lanes (plain kinds, ``static:5``, ``threshold:0.4:20``, ...) get their kind's pure hue;
    other parameters get a deterministic lighter or darker shade of it.
    """
    strategy = str(strategy)
    kind = spec_kind(str(strategy))
    base = KIND_COLORS.get(kind)
    if base is None:
        return OTHER_COLORS[zlib.crc32(kind.encode()) % len(OTHER_COLORS)]
    if strategy == kind or strategy in CANONICAL:
        return base
    step = (zlib.crc32(strategy.encode()) % 4) + 1  # 1..4 -> -0.3, -0.15, +0.2, +0.35
    return _shade(base, (-0.3, -0.15, 0.2, 0.35)[step - 1])


def tint(color: str, amount: float = 0.55) -> str:
    """A light version of a colour (drafted-but-rejected bars, draft time)."""
    return _shade(color, amount)


def styled_figure(data: list[dict], layout: dict, title: str, height: int = HEIGHT) -> go.Figure:
    base = dict(
        template=TEMPLATE,
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        height=height,
        margin=dict(l=60, r=20, t=78, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0, font=dict(size=11)),
        bargap=0.15,
    )
    base.update(layout)
    return go.Figure(data=data, layout=base)


def empty_figure(title: str, message: str = "Press Run to start a race") -> go.Figure:
    layout = dict(
        annotations=[dict(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                          font=dict(size=14, color="#9ca3af"))],
        xaxis=dict(visible=False), yaxis=dict(visible=False),
    )
    return styled_figure([], layout, title)


def _ordered(frame: pd.DataFrame, strategies: list[str] | None) -> list[str]:
    present = list(dict.fromkeys(frame["strategy"])) if not frame.empty else []
    if strategies is None:
        return present
    return [s for s in strategies if s in present] + [s for s in present if s not in strategies]


def _speculative(frame: pd.DataFrame, strategies: list[str]) -> list[str]:
    """Strategies that draft (some row has a stop reason other than 'none')."""
    drafting = set(frame.loc[frame["stop_reason"] != STOP_NONE, "strategy"])
    return [s for s in strategies if s in drafting]


def _rows(lanes: list[str], y_title: str, x_title: str = "iteration", spacing: float = 0.13) -> dict:
    """Layout for one panel per lane, stacked; each panel titled in its lane's colour."""
    n = len(lanes)
    spacing = spacing if n > 1 else 0.0
    h = (1.0 - spacing * (n - 1)) / n
    layout: dict = {"annotations": []}
    for r, lane in enumerate(lanes, start=1):
        top = 1.0 - (r - 1) * (h + spacing)
        suffix = "" if r == 1 else str(r)
        layout[f"yaxis{suffix}"] = dict(domain=[max(0.0, top - h), top], anchor=f"x{suffix}",
                                        title=dict(text=y_title), rangemode="tozero")
        # each lane keeps its own x range: lanes run different numbers of iterations
        layout[f"xaxis{suffix}"] = dict(anchor=f"y{suffix}", title=dict(text=x_title if r == n else ""))
        layout["annotations"].append(dict(text=f"<b>{lane}</b>", x=0.0, y=top, xref="paper", yref="paper",
                                          xanchor="left", yanchor="bottom", showarrow=False,
                                          font=dict(size=12, color=strategy_color(lane))))
    return layout


def _axes(r: int) -> dict:
    suffix = "" if r == 1 else str(r)
    return {"xaxis": f"x{suffix}", "yaxis": f"y{suffix}"}


# ------------------------------------------------------------------------------------------------
# (1) the race


RACE_TITLE = "The race: tokens generated against each lane's own time"


def race_figure(frame: pd.DataFrame, strategies: list[str] | None = None) -> go.Figure:
    """New tokens against elapsed (own, charged) time, one step line per strategy."""
    if frame is None or frame.empty:
        return empty_figure(RACE_TITLE)
    data = []
    for s in _ordered(frame, strategies):
        rows = frame[frame["strategy"] == s]
        t = [0.0] + (rows["elapsed_ms"] / 1000.0).round(4).tolist()
        n = [0] + rows["new_tokens"].tolist()
        it = [0] + rows["iteration"].tolist()
        rate = n[-1] / t[-1] if t[-1] > 0 else math.nan
        data.append(dict(
            type="scatter", x=t, y=n, mode="lines+markers", line_shape="hv", name=f"{s} · {rate:.1f} tok/s",
            line=dict(color=strategy_color(s), width=2.5), marker=dict(size=4), customdata=it,
            hovertemplate=f"<b>{s}</b><br>t = %{{x:.2f}} s<br>tokens = %{{y}}<br>iteration %{{customdata}}<extra></extra>",
        ))
    layout = dict(xaxis=dict(title=dict(text="elapsed time charged to the lane (s)"), rangemode="tozero"),
                  yaxis=dict(title=dict(text="new tokens"), rangemode="tozero"))
    return styled_figure(data, layout, RACE_TITLE)


# ------------------------------------------------------------------------------------------------
# (2) drafted vs accepted per iteration


LOOKAHEAD_TITLE = "Lookahead per iteration: drafted vs accepted (✕ confidence stop)"


def lookahead_figure(frame: pd.DataFrame, strategies: list[str] | None = None) -> go.Figure:
    """Per iteration, per drafting lane: tokens drafted (light bar), accepted (solid bar), the K in force
    (dotted step) and the iterations where drafting stopped because confidence fell below the threshold."""
    if frame is None or frame.empty:
        return empty_figure(LOOKAHEAD_TITLE)
    lanes = _speculative(frame, _ordered(frame, strategies))
    if not lanes:
        return empty_figure(LOOKAHEAD_TITLE, "no lane drafts tokens (autoregressive only)")
    data = []
    for r, s in enumerate(lanes, start=1):
        rows = frame[frame["strategy"] == s]
        color, first, axes = strategy_color(s), r == 1, _axes(r)
        x = rows["iteration"].tolist()
        hover = "%{fullData.name}: %{y}<br>iteration %{x}<extra>" + s + "</extra>"
        data.append(dict(type="bar", x=x, y=rows["lookahead"].tolist(), name="drafted", legendgroup="drafted",
                         showlegend=first, marker=dict(color=tint(color, 0.62), line=dict(color=color, width=1)),
                         hovertemplate=hover, **axes))
        data.append(dict(type="bar", x=x, y=rows["accepted"].tolist(), name="accepted", legendgroup="accepted",
                         showlegend=first, marker=dict(color=color), hovertemplate=hover, **axes))
        data.append(dict(type="scatter", x=x, y=rows["max_lookahead"].tolist(), mode="lines", line_shape="hvh",
                         name="K in force", legendgroup="k", showlegend=first,
                         line=dict(color="#374151", width=1, dash="dot"), hovertemplate=hover, **axes))
        stops = rows[rows["stop_reason"] == STOP_CONFIDENCE]
        if not stops.empty:
            text = [f"min confidence {c:.2f} < τ {t:g}" for c, t in zip(stops["min_confidence"], stops["threshold"])]
            data.append(dict(type="scatter", x=stops["iteration"].tolist(), y=(stops["lookahead"] + 0.7).tolist(),
                             mode="markers", name="confidence stop", legendgroup="stop",
                             marker=dict(symbol="x-thin", size=8, line=dict(width=2, color="#111827")),
                             text=text, hovertemplate="iteration %{x}: %{text}<extra>" + s + "</extra>", **axes))
    layout = _rows(lanes, "tokens")
    layout["barmode"] = "overlay"
    seen = set()
    for d in data:  # one legend entry per marker kind even when only a later lane has confidence stops
        if d["name"] == "confidence stop":
            d["showlegend"] = d["name"] not in seen
            seen.add(d["name"])
    return styled_figure(data, layout, LOOKAHEAD_TITLE, height=max(HEIGHT, 190 * len(lanes) + 90))


# ------------------------------------------------------------------------------------------------
# (3) latency split


LATENCY_TITLE = "Latency per iteration: draft (light) + verify (solid)"


def latency_figure(frame: pd.DataFrame, strategies: list[str] | None = None) -> go.Figure:
    """Per-iteration time, stacked: the assistant's drafting and the target's verification pass.
    Iteration 1 includes the prompt's prefill."""
    if frame is None or frame.empty:
        return empty_figure(LATENCY_TITLE)
    lanes = _ordered(frame, strategies)
    data = []
    for r, s in enumerate(lanes, start=1):
        rows = frame[frame["strategy"] == s]
        color, axes = strategy_color(s), _axes(r)
        x = rows["iteration"].tolist()
        custom = rows[["lookahead", "emitted"]].to_numpy().tolist()
        hover = ("%{fullData.name} %{y:.1f} ms<br>iteration %{x}: drafted %{customdata[0]}, "
                 "emitted %{customdata[1]}<extra></extra>")
        if (rows["lookahead"] > 0).any():
            data.append(dict(type="bar", x=x, y=rows["draft_ms"].round(3).tolist(), name=f"{s} draft", legendgroup=s,
                             marker=dict(color=tint(color, 0.55)), customdata=custom, hovertemplate=hover, **axes))
        data.append(dict(type="bar", x=x, y=rows["verify_ms"].round(3).tolist(), name=f"{s} verify", legendgroup=s,
                         marker=dict(color=color), customdata=custom, hovertemplate=hover, **axes))
    layout = _rows(lanes, "ms")
    layout["barmode"] = "stack"
    layout["showlegend"] = False  # the panel titles name the lanes; light = draft, solid = verify (in the title)
    return styled_figure(data, layout, LATENCY_TITLE, height=max(HEIGHT, 170 * len(lanes) + 90))


# ------------------------------------------------------------------------------------------------
# (4) drafted tokens' confidences


CONFIDENCE_TITLE = "Assistant confidence of each drafted token (● accepted, ✕ rejected)"


def confidence_points(frame: pd.DataFrame, strategy: str) -> pd.DataFrame:
    """One row per drafted token: iteration, index in the draft, x position, confidence, accepted?"""
    rows = frame[frame["strategy"] == strategy]
    out = []
    for it, accepted, cell in zip(rows["iteration"], rows["accepted"], rows["confidences"]):
        confs = parse_confidences(cell)
        for j, c in enumerate(confs):
            x = it + (j + 1) / (len(confs) + 1) - 0.5  # spread the draft across its iteration's slot
            out.append({"iteration": int(it), "index": j + 1, "x": round(x, 4), "confidence": c,
                        "accepted": j < accepted})
    return pd.DataFrame(out, columns=["iteration", "index", "x", "confidence", "accepted"])


def confidence_figure(frame: pd.DataFrame, strategies: list[str] | None = None) -> go.Figure:
    """Every drafted token's confidence, per drafting lane, with the threshold(s) in force as lines.

    A dynamic lane's threshold is drawn on every panel: on a static lane it shows which drafts a
    threshold would have cut (mostly the rejected ones)."""
    if frame is None or frame.empty:
        return empty_figure(CONFIDENCE_TITLE)
    lanes = _speculative(frame, _ordered(frame, strategies))
    if not lanes:
        return empty_figure(CONFIDENCE_TITLE, "no lane drafts tokens (autoregressive only)")
    thresholds = [(s, float(v)) for s in lanes for v in frame.loc[frame["strategy"] == s, "threshold"].dropna().unique()]
    data, shapes = [], []
    layout = _rows(lanes, "confidence")
    for r, s in enumerate(lanes, start=1):
        points = confidence_points(frame, s)
        color, first, axes = strategy_color(s), r == 1, _axes(r)
        for accepted, name in ((True, "accepted draft"), (False, "rejected draft")):
            part = points[points["accepted"] == accepted]
            marker = (dict(color=color, size=7, opacity=0.85) if accepted else
                      dict(symbol="x-thin", size=8, line=dict(width=2, color=_shade(color, -0.35))))
            data.append(dict(
                type="scatter", x=part["x"].tolist(), y=part["confidence"].tolist(), mode="markers", name=name,
                legendgroup=name, showlegend=first, marker=marker, customdata=part[["iteration", "index"]].to_numpy().tolist(),
                hovertemplate="iteration %{customdata[0]}, draft #%{customdata[1]}<br>confidence %{y:.3f}"
                              f"<extra>{s}</extra>", **axes))
        suffix = "" if r == 1 else str(r)
        layout[f"yaxis{suffix}"]["range"] = [-0.04, 1.06]
        for owner, tau in thresholds:
            own = owner == s
            line_color = strategy_color(owner)
            shapes.append(dict(type="line", xref=f"x{suffix} domain", x0=0, x1=1, yref=f"y{suffix}", y0=tau, y1=tau,
                               line=dict(color=line_color, width=2 if own else 1.2, dash="dash" if own else "dot")))
            layout["annotations"].append(dict(
                text=f"τ = {tau:g}" + ("" if own else f" ({owner})"), xref=f"x{suffix} domain", x=1.0, xanchor="right",
                yref=f"y{suffix}", y=tau, yanchor="bottom", showarrow=False, font=dict(size=10, color=line_color),
                bgcolor="rgba(255,255,255,0.85)", borderpad=1))
    layout["shapes"] = shapes
    return styled_figure(data, layout, CONFIDENCE_TITLE, height=max(HEIGHT, 190 * len(lanes) + 90))


# ------------------------------------------------------------------------------------------------
# (5) acceptance by draft position


POSITIONS_TITLE = ("Acceptance by draft position<br><sup>share of drafts whose i-th token was accepted, among those whose "
                   "first i − 1 were (counts on hover and in the CSV)</sup>")


def positions_figure(frame: pd.DataFrame, strategies: list[str] | None = None) -> go.Figure:
    """Per drafting lane, the conditional acceptance of each draft position (``position_acceptance``): one line per
    lane, each point sized by how many drafts reached it."""
    if frame is None or frame.empty:
        return empty_figure(POSITIONS_TITLE)
    lanes = _speculative(frame, _ordered(frame, strategies))
    table = position_acceptance(frame[frame["strategy"].isin(lanes)])
    if table.empty:
        return empty_figure(POSITIONS_TITLE, "no lane has drafted a token yet")
    data = []
    biggest = max(1, int(table["reached"].max()))
    for s in lanes:
        rows = table[table["strategy"] == s]
        if rows.empty:
            continue
        color = strategy_color(s)
        sizes = [6 + 12 * math.sqrt(n / biggest) for n in rows["reached"]]
        data.append(dict(type="scatter", x=rows["position"].tolist(), y=rows["rate"].round(4).tolist(),
                         mode="lines+markers", name=s, line=dict(color=color, width=2),
                         marker=dict(color=color, size=sizes, line=dict(color="white", width=1)),
                         customdata=rows[["accepted", "reached"]].to_numpy().tolist(),
                         hovertemplate="position %{x}: %{y:.0%} (%{customdata[0]} of %{customdata[1]})"
                                       f"<extra>{s}</extra>"))
    layout = dict(xaxis=dict(title=dict(text="draft position i"), dtick=1 if table["position"].max() <= 20 else None),
                  yaxis=dict(title=dict(text="P(i accepted | 1..i−1 accepted)"), range=[-0.04, 1.06], tickformat=".0%"),
                  legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0.0, font=dict(size=11)),
                  margin=dict(l=60, r=20, t=78, b=90))
    return styled_figure(data, layout, POSITIONS_TITLE, height=HEIGHT + 40)


def all_figures(frame: pd.DataFrame, strategies: list[str] | None = None) -> tuple[go.Figure, ...]:
    """The app's five live figures, in display order."""
    return (race_figure(frame, strategies), lookahead_figure(frame, strategies),
            latency_figure(frame, strategies), confidence_figure(frame, strategies), positions_figure(frame, strategies))
