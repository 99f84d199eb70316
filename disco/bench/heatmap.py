"""The speed-up heatmap over tau x KMAX: its grid, a Plotly figure (app, heatmap.html) and a static SVG."""

from __future__ import annotations

import html
import math
import statistics

import pandas as pd

from disco.bench.analysis import best_settings, overall_rows
from disco.policies import DEFAULT_MAX_LOOKAHEAD, DEFAULT_THRESHOLD, Threshold

REFERENCE_CELL = (DEFAULT_THRESHOLD, DEFAULT_MAX_LOOKAHEAD)  # transformers' defaults, boxed on every heatmap


def _threshold_rows(summary: pd.DataFrame) -> pd.DataFrame:
    overall = overall_rows(summary)
    if overall.empty or "policy_kind" not in overall:
        return overall.iloc[0:0] if not overall.empty else overall
    return overall[overall["policy_kind"] == Threshold.kind]


def cell_of(summary: pd.DataFrame, spec: str | None) -> tuple[float, int] | None:
    """The (τ, KMAX) cell of a threshold setting in the summary, or None."""
    rows = _threshold_rows(summary)
    if not spec or rows.empty or spec not in rows.index:
        return None
    return float(rows.loc[spec, "tau"]), int(rows.loc[spec, "kmax"])


def heatmap_grid(summary: pd.DataFrame) -> tuple[list[float], list[int], list[list[float]]]:
    """(taus, kmaxes, z[tau][kmax]) of replay geomean speed-ups over the threshold settings."""
    cells = {}
    for _, row in _threshold_rows(summary).iterrows():
        cells[(float(row["tau"]), int(row["kmax"]))] = row["speedup_geomean"]
    taus = sorted({t for t, _ in cells})
    ks = sorted({k for _, k in cells})
    z = [[cells.get((t, k), math.nan) for k in ks] for t in taus]
    return taus, ks, z


def heatmap_figure(summary: pd.DataFrame, title: str | None = None):
    """Plotly heatmap of speed-up over tau x KMAX, coloured around the best static K (white = as good)."""
    import plotly.graph_objects as go

    taus, ks, z = heatmap_grid(summary)
    best = best_settings(summary)
    ref = best.get("best_static_speedup", math.nan)
    text = [[("" if v != v else f"{v:.2f}") for v in row] for row in z]
    flat = [v for row in z for v in row if v == v]
    heat = dict(type="heatmap", x=[str(k) for k in ks], y=[format(t, "g") for t in taus], z=z, text=text,
                texttemplate="%{text}", colorscale="RdBu", reversescale=False,
                colorbar=dict(title=dict(text="speed-up")),
                hovertemplate="τ=%{y}, KMAX=%{x}: %{z:.3f}x<extra></extra>")
    if flat and ref == ref:
        span = max(abs(max(flat) - ref), abs(min(flat) - ref), 1e-3)
        heat.update(zmid=ref, zmin=ref - span, zmax=ref + span)
    data = [heat]
    marks = [(*REFERENCE_CELL, f"τ={REFERENCE_CELL[0]:g}, KMAX={REFERENCE_CELL[1]}", "#111827")]
    bt = best.get("best_threshold")
    cell = cell_of(summary, bt)
    if cell:
        marks.append((*cell, f"best {bt}", "#16a34a"))
    for tau, k, name, color in marks:
        if tau in taus and k in ks:
            data.append(dict(type="scatter", x=[str(k)], y=[format(tau, "g")], mode="markers", name=name,
                             marker=dict(symbol="square-open", size=26, line=dict(width=3, color=color)),
                             hoverinfo="name"))
    if title is None:
        bs = best.get("best_static")
        title = (f"Speed-up over autoregressive (geometric mean), threshold τ × KMAX; best static: {bs} = {ref:.2f}x"
                 if bs else "Speed-up over autoregressive (geometric mean), threshold τ × KMAX")
    layout = dict(title=dict(text=title, font=dict(size=14)), xaxis=dict(title=dict(text="KMAX"), type="category"),
                  yaxis=dict(title=dict(text="τ (confidence threshold)"), type="category"),
                  height=max(420, 28 * len(taus) + 160), margin=dict(l=70, r=30, t=60, b=50),
                  legend=dict(orientation="h", y=-0.15), plot_bgcolor="white", paper_bgcolor="white")
    return go.Figure(data=data, layout=layout)


def _svg_color(v: float, ref: float, span: float) -> str:
    """RdBu-like: red below the reference, blue above, white at it."""
    if v != v:
        return "#eeeeee"
    x = max(-1.0, min(1.0, (v - ref) / span)) if span > 0 else 0.0
    lo, mid, hi = (178, 24, 43), (247, 247, 247), (33, 102, 172)
    end = hi if x > 0 else lo
    t = abs(x)
    r, g, b = (round(m + (e - m) * t) for m, e in zip(mid, end))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap_svg(summary: pd.DataFrame) -> str:
    """The same heatmap as a dependency-free SVG (embeddable in Markdown; no kaleido needed)."""
    taus, ks, z = heatmap_grid(summary)
    best = best_settings(summary)
    ref = best.get("best_static_speedup", math.nan)
    flat = [v for row in z for v in row if v == v]
    ref = ref if ref == ref else (statistics.median(flat) if flat else 1.0)
    span = max([abs(v - ref) for v in flat] + [1e-3])
    cw, ch, left, top = 64, 22, 90, 92
    width, height = max(left + cw * len(ks) + 20, 560), top + ch * len(taus) + 24
    bt = best.get("best_threshold")
    best_cell = cell_of(summary, bt)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           '<text x="10" y="20" font-size="14" font-weight="bold">Speed-up over autoregressive (geometric mean), τ × KMAX</text>',
           f'<text x="10" y="40">white = as fast as the best static K ({html.escape(str(best.get("best_static")))}, '
           f'{ref:.2f}x); blue = faster than it, red = slower</text>',
           f'<text x="10" y="58">black box: τ 0.4 / KMAX 20 (transformers\' default); green box: best threshold '
           f'({html.escape(str(bt))})</text>']
    for j, k in enumerate(ks):
        out.append(f'<text x="{left + j * cw + cw / 2}" y="{top - 4}" text-anchor="middle">KMAX {k}</text>')
    for i, tau in enumerate(taus):
        y = top + i * ch
        out.append(f'<text x="{left - 6}" y="{y + ch / 2 + 4}" text-anchor="end">τ {tau:g}</text>')
        for j, k in enumerate(ks):
            v = z[i][j]
            x = left + j * cw
            out.append(f'<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="{_svg_color(v, ref, span)}" stroke="white"/>')
            if v == v:
                out.append(f'<text x="{x + cw / 2}" y="{y + ch / 2 + 4}" text-anchor="middle">{v:.2f}</text>')
            stroke = None
            if best_cell and (tau, k) == tuple(best_cell):
                stroke = "#16a34a"
            elif (tau, k) == REFERENCE_CELL:
                stroke = "#111827"
            if stroke:
                out.append(f'<rect x="{x + 1.5}" y="{y + 1.5}" width="{cw - 3}" height="{ch - 3}" fill="none" '
                           f'stroke="{stroke}" stroke-width="2.5"/>')
    out.append("</svg>")
    return "\n".join(out)
