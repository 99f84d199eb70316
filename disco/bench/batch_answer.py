"""The batch-size study's answer (``disco.bench.batch``'s rows -> per-B choices, schedules, markdown).

"Near-optimal" is fixed before any run: a setting is near-optimal at a batch size when its test-split speed-up is at
least ``NEAR`` (95 %) of the best static K's and of the best threshold's, each chosen on the train split. Settings to
take away are written per layout as a schedule in each engine's own words:

* vLLM: ``num_speculative_tokens_per_batch_size`` (PR #32374; its exact shape could not be read in our stored copy of
  vLLM's source, so we write the mapping batch size -> K the PR describes and say so), and the long-standing
  ``disable_by_batch_size`` (speculation off from that many running requests) where no speculation pays;
* TensorRT-LLM: ``draft_len_schedule`` (batch-size threshold -> draft length; PRs #8194, #10860, #12262: same caveat);
* SGLang: ``--speculative-adaptive`` takes no schedule (it adapts its own depth), so the schedule cannot be expressed;
  its shared-state rule is raced as ``sglang:3`` instead;
* a τ schedule (threshold by batch size) has no engine format yet (vLLM's confidence threshold, PR #35301, is open).
"""

from __future__ import annotations

import json
import math

import pandas as pd

from disco.bench.batch import BASELINE, REFERENCE

NEAR = 0.95
ANSWER_COLUMNS = ["layout", "batch", "best_static", "best_static_speedup", "best_threshold", "best_threshold_speedup",
                  "reference_speedup", "reference_share_of_static", "reference_share_of_threshold", "reference_near",
                  "batchstop_speedup", "sglang_speedup", "free_reference_speedup", "best_dynamic", "best_dynamic_speedup",
                  "speculation_pays"]


def _best(frame: pd.DataFrame, kinds: tuple[str, ...]) -> str | None:
    rows = frame[frame["kind"].isin(kinds)]
    if rows.empty or rows["speedup"].isna().all():
        return None
    return str(rows.loc[rows["speedup"].idxmax(), "strategy"])


def _test(frame: pd.DataFrame, spec: str | None) -> float:
    if spec is None:
        return math.nan
    hit = frame.loc[frame["strategy"] == spec, "speedup"]
    return float(hit.iloc[0]) if len(hit) else math.nan


def answer(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (layout, B): choices on train, figures on test (closed loop)."""
    closed = rows[rows["arrival"] == "closed"]
    has_train = (closed["split"] == "train").any()
    out = []
    for (layout, batch), group in closed.groupby(["layout", "batch"], sort=True):
        train = group[group["split"] == ("train" if has_train else group["split"].iloc[0])]
        test = group[group["split"] == ("test" if (group["split"] == "test").any() else train["split"].iloc[0])]
        static, threshold = _best(train, ("static",)), _best(train, ("threshold",))
        dynamic = _best(train, tuple(k for k in train["kind"].unique() if k not in ("static", BASELINE)))
        s, t, r = _test(test, static), _test(test, threshold), _test(test, REFERENCE)
        drafting = _best(train, tuple(k for k in train["kind"].unique() if k != BASELINE))
        out.append({"layout": layout, "batch": int(batch), "best_static": static, "best_static_speedup": s,
                    "best_threshold": threshold, "best_threshold_speedup": t, "reference_speedup": r,
                    "reference_share_of_static": r / s if s else math.nan,
                    "reference_share_of_threshold": r / t if t else math.nan,
                    "reference_near": bool(r >= NEAR * s and r >= NEAR * t) if s == s and t == t and r == r else False,
                    "batchstop_speedup": _test(test, next((x for x in test["strategy"] if x.startswith("batchstop")),
                                                          None)),
                    "sglang_speedup": _test(test, next((x for x in test["strategy"] if x.startswith("sglang")), None)),
                    "free_reference_speedup": _test(test, f"free:{REFERENCE}"),
                    "best_dynamic": dynamic, "best_dynamic_speedup": _test(test, dynamic),
                    "speculation_pays": bool(_test(test, drafting) > 1.0)})
    return pd.DataFrame(out, columns=ANSWER_COLUMNS)


def no_speculation_from(ans: pd.DataFrame, layout: str, column: str = "speculation_pays") -> int | None:
    """The smallest batch size from which (at every larger measured B too) no drafting setting beats the target
    (``column`` static_pays: no static K does)."""
    rows = ans[ans["layout"] == layout].sort_values("batch")
    pays = list(zip(rows["batch"], rows[column]))
    for i, (batch, _) in enumerate(pays):
        if not any(p for _, p in pays[i:]):
            return int(batch)
    return None


def schedules(ans: pd.DataFrame, layout: str) -> dict:
    """The best static K and threshold per batch size as each engine's schedule (module docstring): K 0 where no
    static K beats the target alone at that B, and vLLM's ``disable_by_batch_size`` from where none does at any
    larger B either."""
    rows = ans[ans["layout"] == layout].sort_values("batch").assign(
        static_pays=lambda a: a["best_static_speedup"] > 1.0)
    ks = {int(b): int(s.split(":")[1]) if isinstance(s, str) and p else 0
          for b, s, p in zip(rows["batch"], rows["best_static"], rows["static_pays"])}
    off = no_speculation_from(rows, layout, "static_pays")
    taus = {int(b): float(s.split(":")[1]) for b, s in zip(rows["batch"], rows["best_threshold"]) if isinstance(s, str)}
    vllm: dict = {"num_speculative_tokens_per_batch_size": {str(b): k for b, k in ks.items()}}
    if off is not None:
        vllm["disable_by_batch_size"] = off
    return {"vllm": vllm, "tensorrt_llm": {"draft_len_schedule": {str(b): k for b, k in ks.items()}},
            "sglang": "not expressible: --speculative-adaptive adapts its own depth and takes no schedule",
            "threshold_by_batch_size": {str(b): t for b, t in taus.items()}}


def _f(x: float, pct: bool = False) -> str:
    if x != x:
        return "-"
    return f"{100 * x:.0f} %" if pct else f"{x:.2f}x"


def markdown(rows: pd.DataFrame, ans: pd.DataFrame, label: str, command: str) -> str:
    lines = [f"# The seed's question per batch size", "", f"Costs: **{label}**.", "",
             f"Command: `{command}`", "",
             f"Settings chosen on the train prompts, speed-ups (throughput over the target alone's at the same B and "
             f"layout, steady-state window) on the test prompts. Near-optimal (fixed before the run): at least "
             f"{100 * NEAR:.0f} % of the best static K's and of the best threshold's test speed-up.", ""]
    for layout in ans["layout"].unique():
        part = ans[ans["layout"] == layout]
        lines += [f"## Layout `{layout}`", "",
                  "| B | best static K | speed-up | best threshold | speed-up | τ 0.4 / 20 | share of static | share of "
                  "threshold | batch stop | SGLang shared | τ 0.4 / 20, free | best dynamic |", "|" + "---|" * 12]
        for _, a in part.iterrows():
            lines.append(f"| {a.batch} | {a.best_static} | {_f(a.best_static_speedup)} | {a.best_threshold} | "
                         f"{_f(a.best_threshold_speedup)} | {_f(a.reference_speedup)} | "
                         f"{_f(a.reference_share_of_static, True)} | {_f(a.reference_share_of_threshold, True)} | "
                         f"{_f(a.batchstop_speedup)} | {_f(a.sglang_speedup)} | {_f(a.free_reference_speedup)} | "
                         f"{a.best_dynamic} "
                         f"{_f(a.best_dynamic_speedup)} |")
        off = no_speculation_from(ans, layout)
        static_off = no_speculation_from(part.assign(static_pays=part["best_static_speedup"] > 1.0), layout,
                                         "static_pays")
        lines += ["", f"No speculation pays from B = {off}." if off else "Some speculation pays at every measured B.",
                  f"No static K pays from B = {static_off}." if static_off else "A static K pays at every measured B.",
                  "", "Schedules to take away:", "", "```json", json.dumps(schedules(ans, layout), indent=1), "```", ""]
    open_loop = rows[(rows["arrival"] != "closed") & (rows["split"] == rows["split"].iloc[-1])]
    if not open_loop.empty:
        lines += ["## Poisson arrivals (largest B as the slot cap)", "",
                  "| layout | rate | setting | tokens/s | speed-up | TPOT p50 / p99 ms | TTFT p50 ms | goodput req/s |",
                  "|---|---|---|---|---|---|---|---|"]
        keep = open_loop[open_loop["strategy"].isin([BASELINE, REFERENCE]) | open_loop["kind"].eq("batchstop")]
        for _, r in keep.iterrows():
            lines.append(f"| {r.layout} | {r.arrival} | {r.strategy} | {r.tokens_per_s:.1f} | {_f(r.speedup)} | "
                         f"{r.tpot_ms_p50:.1f} / {r.tpot_ms_p99:.1f} | {r.ttft_ms_p50:.1f} | {r.goodput_rps:.3f} |")
    return "\n".join(lines) + "\n"


def heatmaps(rows: pd.DataFrame, label: str):
    """Test-split speed-up as heatmaps, one row per layout: batch size x static K, batch size x τ (thresholds at their
    KMAX), labelled with the costs' source."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    closed = rows[rows["arrival"] == "closed"]
    test = closed[closed["split"] == ("test" if (closed["split"] == "test").any() else closed["split"].iloc[0])]
    layouts = list(dict.fromkeys(test["layout"]))
    fig = make_subplots(rows=len(layouts), cols=2, vertical_spacing=0.08,
                        subplot_titles=[f"{layout}: B x {what}" for layout in layouts for what in ("static K", "τ")])
    for r, layout in enumerate(layouts, start=1):
        for col, kind in ((1, "static"), (2, "threshold")):
            part = test[(test["kind"] == kind) & (test["layout"] == layout)].copy()
            if part.empty:
                continue
            part["param"] = part["strategy"].str.split(":").str[1].astype(float)
            grid = part.pivot_table(index="param", columns="batch", values="speedup")
            fig.add_trace(go.Heatmap(z=grid.values, x=[str(b) for b in grid.columns], y=[f"{v:g}" for v in grid.index],
                                     coloraxis="coloraxis", hovertemplate="B %{x}, %{y}: %{z:.2f}x<extra></extra>"),
                          row=r, col=col)
    fig.update_layout(title=f"Speed-up over the target alone per batch size, test prompts ({label})",
                      coloraxis=dict(colorscale="RdBu", cmid=1.0), height=320 * len(layouts) + 80)
    return fig


def band_table(answers: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (layout, B), the answer's spread over a roofline's band (``answers``: the answer under each model of the
    band, by its note; "nominal" first): the best static K and best τ as intervals, speculation paying or not, and
    ``flips`` where a conclusion changes inside the band."""
    nominal = answers["nominal"]
    rows = []
    for _, a in nominal.iterrows():
        same = [ans[(ans["layout"] == a.layout) & (ans["batch"] == a.batch)].iloc[0] for ans in answers.values()]
        ks = [int(s.best_static.split(":")[1]) for s in same if isinstance(s.best_static, str)]
        taus = [float(s.best_threshold.split(":")[1]) for s in same if isinstance(s.best_threshold, str)]
        pays = {bool(s.speculation_pays) for s in same}
        near = {bool(s.reference_near) for s in same}
        reference_pays = {bool(s.reference_speedup > 1.0) for s in same}
        rows.append({"layout": a.layout, "batch": int(a.batch), "best_static": a.best_static,
                     "k_low": min(ks, default=math.nan), "k_high": max(ks, default=math.nan),
                     "best_threshold": a.best_threshold, "tau_low": min(taus, default=math.nan),
                     "tau_high": max(taus, default=math.nan),
                     "reference_speedup_low": min(s.reference_speedup for s in same),
                     "reference_speedup_high": max(s.reference_speedup for s in same),
                     "speculation_pays": a.speculation_pays,
                     "flips": len(pays) > 1 or len(near) > 1 or len(reference_pays) > 1,
                     "models": len(same)})
    return pd.DataFrame(rows)


def band_markdown(band: pd.DataFrame, label: str) -> str:
    lines = [f"## Uncertainty band ({label})", "",
             "Every uncertain factor of the device (bandwidth and compute efficiency, per-kernel time, host time per "
             "iteration) at each end of its stated range, and the two corners; a conclusion that changes inside the "
             "band (speculation pays or not, τ 0.4 / 20 beats the target alone or not, τ 0.4 / 20 near-optimal or "
             "not) is flagged.", "",
             "| layout | B | best static K (band) | best τ (band) | τ 0.4 / 20 speed-up (band) | flips |",
             "|---|---|---|---|---|---|"]
    for _, b in band.iterrows():
        lines.append(f"| {b.layout} | {b.batch} | {b.best_static} ({b.k_low:g}-{b.k_high:g}) | {b.best_threshold} "
                     f"({b.tau_low:g}-{b.tau_high:g}) | {_f(b.reference_speedup_low)}-{_f(b.reference_speedup_high)} "
                     f"| {'**yes**' if b.flips else 'no'} |")
    return "\n".join(lines) + "\n"
