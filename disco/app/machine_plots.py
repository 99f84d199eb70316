"""The "This machine" tab's figures: what a pass costs here and the speed-up per static K (input:
``disco.costs.profile.Profile.to_dict()``, plain data)."""

from __future__ import annotations

import plotly.graph_objects as go

from disco.app.plots import empty_figure, styled_figure


PRECISION_COLORS = {"model": "#0072b2", "int8": "#009e73", "q4_0": "#cc79a7"}
ENGINE_COLORS = {"torch": "#d55e00", "llamacpp": "#117733"}
# two lines each, so neither title is cut at the page width; the legends sit below the plots, off the titles
MACHINE_COST_TITLE = "What a pass costs here<br><sup>target pass vs tokens verified (per engine), assistant step per precision</sup>"
MACHINE_LEGEND = dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0.0, font=dict(size=11))
MACHINE_SPEEDUP_TITLE = "Speed-up per static K here<br><sup>Leviathan's prediction with the measured verification cost, and exact replay</sup>"


def _engine(profile: dict) -> str:
    return profile.get("key", {}).get("engine", "torch")


def machine_cost_figure(profile: dict | None, others: list[dict] = ()) -> go.Figure:
    """The target's pass cost against tokens verified for this run's engine and every other engine measured here
    (``others``), and the assistant steps of this one."""
    if not profile:
        return empty_figure(MACHINE_COST_TITLE, "measuring this machine's profile…")
    data = []
    for prof in [profile, *others]:
        target = sorted((int(n), ms) for n, ms in prof["target_ms"].items())
        engine = _engine(prof)
        data.append(dict(type="scatter", mode="lines+markers", x=[n for n, _ in target], y=[ms for _, ms in target],
                         name=f"target pass, {'llama.cpp' if engine == 'llamacpp' else 'torch'} ({prof['dtype']})",
                         line=dict(color=ENGINE_COLORS.get(engine, "#d55e00"), width=2.5 if prof is profile else 1.5),
                         hovertemplate="%{x} tokens: %{y:.0f} ms<extra>" + engine + "</extra>"))
    xmax = max(int(n) for n in profile["target_ms"])
    for p, costs in profile["assistant_ms"].items():
        ms = costs.get("1", costs.get(1))
        data.append(dict(type="scatter", mode="lines", x=[1, xmax], y=[ms, ms], name=f"assistant step ({p})",
                         line=dict(color=PRECISION_COLORS.get(p, "#666"), dash="dash", width=2),
                         hovertemplate=f"{ms:.0f} ms a step (c = {profile['cost_ratio'][p]:.2f})<extra>{p}</extra>"))
    layout = dict(xaxis=dict(title="tokens fed to the target (1 + drafts)"),
                  yaxis=dict(title="ms per forward pass", rangemode="tozero"), legend=MACHINE_LEGEND,
                  margin=dict(l=60, r=20, t=70, b=110))
    return styled_figure(data, layout, MACHINE_COST_TITLE)


def machine_speedup_figure(profile: dict | None) -> go.Figure:
    if not profile:
        return empty_figure(MACHINE_SPEEDUP_TITLE, "measuring this machine's profile…")
    data = []
    for p, rows in profile.get("leviathan", {}).items():
        color = PRECISION_COLORS.get(p, "#666")
        data.append(dict(type="scatter", mode="lines", x=[r["k"] for r in rows],
                         y=[r["speedup_measured_verify"] for r in rows], name=f"Leviathan, {p} assistant",
                         line=dict(color=color, width=2),
                         hovertemplate="K=%{x}: %{y:.2f}×<extra>" + p + "</extra>"))
        replay = profile.get("replay", {}).get(p, {})
        ks = sorted((int(s.split(":")[1]), v) for s, v in replay.items() if s.startswith("static:"))
        if ks:
            data.append(dict(type="scatter", mode="markers", x=[k for k, _ in ks], y=[v for _, v in ks],
                             name=f"replay static K, {p}", marker=dict(color=color, size=8, symbol="diamond"),
                             hovertemplate="static:%{x}: %{y:.2f}× (replay)<extra>" + p + "</extra>"))
    data.append(dict(type="scatter", mode="lines", x=[1, 32], y=[1, 1], name="autoregressive",
                     line=dict(color="#94a3b8", dash="dot"), hoverinfo="skip"))
    layout = dict(xaxis=dict(title="static lookahead K"), yaxis=dict(title="speed-up over autoregressive",
                                                                    rangemode="tozero"),
                  legend=MACHINE_LEGEND, margin=dict(l=60, r=20, t=70, b=110))
    return styled_figure(data, layout, MACHINE_SPEEDUP_TITLE)
