"""The batch-size study's answer (``disco.bench.batch``'s rows -> per-B choices, schedules, markdown).

"Near-optimal" is fixed before any run: a setting is near-optimal at a batch size when its test-split speed-up is at
least ``NEAR`` (95 %) of the best static K's and of the best threshold's, each chosen on the train split. The answer
is per (layout, cached context, B). Settings to take away are written per layout (and per context where the study
had several) as a schedule in each engine's own words; a batch size between two measured ones takes the K of the
measured one below it:

* vLLM: ``num_speculative_tokens_per_batch_size``, a list of ``[bs_lo, bs_hi, K]`` ranges (PR #32374; the scheduler
  indexes its lookup by the number of scheduled requests and clamps each K to ``num_speculative_tokens``, which we
  set to the schedule's largest K); K 0 turns speculation off in a range (V1 has no ``disable_by_batch_size``). Over
  several contexts, also the five-item ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]`` entries of the open PR #48944 (RFC
  #48627), with our cached context as ``ctx``;
* TensorRT-LLM: ``draft_len_schedule``, batch-size thresholds -> draft length ("from this batch size on"), which
  must give batch size 1 the configured ``max_draft_len``: a schedule whose K rises after B = 1 cannot be written
  exactly, so later entries are capped at B = 1's K and the cap is said (``note``);
* SGLang: ``--speculative-adaptive`` takes no schedule (it adapts its own depth), so the schedule cannot be expressed;
  its shared-state rule is raced as ``sglang:3`` instead;
* a τ schedule (threshold by batch size) has no engine format yet (vLLM's confidence threshold, PR #35301, is open).
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd

from disco.bench.batch import BASELINE, REFERENCE

NEAR = 0.95
ANSWER_COLUMNS = ["layout", "context", "batch", "best_static", "best_static_speedup", "best_threshold", "best_threshold_speedup",
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


def with_context(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``context`` column (0 for rows written before the study had one)."""
    return rows if "context" in rows.columns else rows.assign(context=0)


def answer(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (layout, context, B): choices on train, figures on test (closed loop)."""
    closed = with_context(rows[rows["arrival"] == "closed"])
    has_train = (closed["split"] == "train").any()
    out = []
    for (layout, context, batch), group in closed.groupby(["layout", "context", "batch"], sort=True):
        train = group[group["split"] == ("train" if has_train else group["split"].iloc[0])]
        test = group[group["split"] == ("test" if (group["split"] == "test").any() else train["split"].iloc[0])]
        static, threshold = _best(train, ("static",)), _best(train, ("threshold",))
        dynamic = _best(train, tuple(k for k in train["kind"].unique() if k not in ("static", BASELINE)))
        s, t, r = _test(test, static), _test(test, threshold), _test(test, REFERENCE)
        drafting = _best(train, tuple(k for k in train["kind"].unique() if k != BASELINE))
        out.append({"layout": layout, "context": int(context), "batch": int(batch), "best_static": static, "best_static_speedup": s,
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


def _part(ans: pd.DataFrame, layout: str, context: int | None = None) -> pd.DataFrame:
    """The answer's rows of one layout at one context (default: the smallest the answer has)."""
    ans = with_context(ans)
    rows = ans[ans["layout"] == layout]
    if rows.empty:
        return rows
    return rows[rows["context"] == (rows["context"].min() if context is None else context)].sort_values("batch")


def no_speculation_from(ans: pd.DataFrame, layout: str, column: str = "speculation_pays",
                        context: int | None = None) -> int | None:
    """The smallest batch size from which (at every larger measured B too) no drafting setting beats the target
    (``column`` static_pays: no static K does), at one context (default: the smallest)."""
    rows = _part(ans, layout, context)
    pays = list(zip(rows["batch"], rows[column]))
    for i, (batch, _) in enumerate(pays):
        if not any(p for _, p in pays[i:]):
            return int(batch)
    return None


def _k_at(ks: dict[int, int], batch: int) -> int:
    """The K a schedule gives ``batch``: that of the largest measured B at or below it (the smallest measured B's
    below them all)."""
    return ks[max((b for b in ks if b <= batch), default=min(ks))]


def _merged(batches, value) -> list[list]:
    """vLLM's batch-size ranges ``[lo, hi, value(B)]`` for measured batch sizes: each from its B to the next measured
    B - 1, the first from 1 (vLLM requires it: every runtime batch size needs a K), the last up to its own B (vLLM
    carries the last K on); neighbouring ranges with one value merged."""
    bs = sorted(batches)
    out: list[list] = []
    for i, b in enumerate(bs):
        hi = bs[i + 1] - 1 if i + 1 < len(bs) else b
        if out and out[-1][2] == value(b):
            out[-1][1] = hi
        else:
            out.append([1 if i == 0 else b, hi, value(b)])
    return out


def _ranges(ks: dict[int, int]) -> list[list[int]]:
    """``[[lo, hi, K], ...]`` (``_merged``)."""
    return _merged(ks, lambda b: ks[b])


def _tensorrt(ks: dict[int, int]) -> dict:
    """TensorRT-LLM's ``max_draft_len`` and ``draft_len_schedule`` (thresholds where K changes) for a K per B."""
    first = ks[min(ks)]
    if first == 0:
        return {"note": "no static K beats the target alone at the smallest measured batch size: leave speculation off"}
    schedule, capped, last = {}, [], None
    for b in sorted(ks):
        k = min(ks[b], first)
        if ks[b] > first:
            capped.append(b)
        if k != last:
            schedule[str(1 if not schedule else b)] = k
            last = k
    out: dict = {"max_draft_len": first, "draft_len_schedule": schedule}
    notes = []
    if min(ks) != 1:
        notes.append(f"batch size 1 was not measured: its entry is B = {min(ks)}'s K")
    if capped:
        notes.append(f"not expressible exactly: batch size 1's draft length must be max_draft_len ({first}), so B = "
                     f"{', '.join(map(str, capped))} (best K above {first}) are capped at {first}")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def _static_ks(rows: pd.DataFrame) -> dict[int, int]:
    """The best static K per batch size, 0 where no static K beats the target alone."""
    return {int(b): int(s.split(":")[1]) if isinstance(s, str) and p > 1.0 else 0
            for b, s, p in zip(rows["batch"], rows["best_static"], rows["best_static_speedup"])}


def schedules(ans: pd.DataFrame, layout: str, context: int | None = None) -> dict:
    """The best static K and threshold per batch size at one cached context (default: the smallest) as each engine's
    schedule (module docstring): K 0 where no static K beats the target alone at that B."""
    rows = _part(ans, layout, context)
    ks = _static_ks(rows)
    taus = {int(b): float(s.split(":")[1]) for b, s in zip(rows["batch"], rows["best_threshold"]) if isinstance(s, str)}
    vllm: dict = {"num_speculative_tokens": max(ks.values(), default=0),
                  "num_speculative_tokens_per_batch_size": _ranges(ks)}
    if ks and min(ks) != 1:
        vllm["note"] = f"batch size 1 was not measured: the first range starts at 1 with B = {min(ks)}'s K"
    if not vllm["num_speculative_tokens"]:
        vllm = {"note": "no static K beats the target alone at any measured batch size: leave speculation off"}
    return {"vllm": vllm, "tensorrt_llm": _tensorrt(ks) if ks else {},
            "sglang": "not expressible: --speculative-adaptive adapts its own depth and takes no schedule",
            "threshold_by_batch_size": {str(b): t for b, t in taus.items()},
            "batch_sizes_beyond": f"measured up to B = {max(ks, default=0)}; both engines carry the last K on to "
                                  "larger batch sizes"}


CTX_INFINITY = 2**31 - 1


def batch_x_context(ans: pd.DataFrame, layout: str) -> list[list[int]]:
    """vLLM's five-item ``[bs_lo, bs_hi, ctx_lo, ctx_hi, K]`` entries (PR #48944, open; its validator in a stored
    fork: batch-size ranges from 1, not overlapping; context ranges from 1, contiguous, the last to 2^31 - 1; a
    rectangular grid, every batch range over every context range). A context range starts at a measured context (the
    first at 1) and ends before the next; neighbouring batch ranges merge where K is the same at every context."""
    contexts = sorted(int(c) for c in with_context(ans).loc[lambda a: a["layout"] == layout, "context"].unique())
    ks = {c: _static_ks(_part(ans, layout, c)) for c in contexts}
    batches = set().union(*(set(k) for k in ks.values()))
    rows = _merged(batches, lambda b: tuple(_k_at(k, b) for k in ks.values()))  # [lo, hi, (K at each context)]
    spans = [(1 if i == 0 else c, contexts[i + 1] - 1 if i + 1 < len(contexts) else CTX_INFINITY)
             for i, c in enumerate(contexts)]
    return [[lo, hi, clo, chi, column[j]] for lo, hi, column in rows for j, (clo, chi) in enumerate(spans)]


def vllm_batch_x_context(ans: pd.DataFrame, layout: str) -> dict:
    """vLLM's speculative settings for the batch x context schedule (``batch_x_context``)."""
    entries = batch_x_context(ans, layout)
    return {"num_speculative_tokens": max((e[4] for e in entries), default=0),
            "num_speculative_tokens_per_batch_size": entries,
            "note": "five-item entries of vLLM PR #48944 (open, RFC #48627). vLLM's ctx is a request's whole context; "
                    "here ctx_lo is the prefix cached before the prompt (the suite's prompts and outputs add a few "
                    "hundred tokens)"}


def schedules_by_context(ans: pd.DataFrame, layout: str) -> dict:
    """Every context's schedules, and vLLM's batch x context form (``vllm_batch_x_context``)."""
    contexts = sorted(int(c) for c in with_context(ans).loc[lambda a: a["layout"] == layout, "context"].unique())
    if len(contexts) <= 1:
        return schedules(ans, layout)
    return {"by_context": {str(c): schedules(ans, layout, c) for c in contexts},
            "vllm_batch_x_context": vllm_batch_x_context(ans, layout)}


def to_json(obj) -> str:
    """``obj`` as indented JSON with every list of numbers on one line (a schedule's ranges stay readable)."""
    text = json.dumps(obj, indent=1)
    numbers = r"\[\s+(-?[\d.]+(?:,\s+-?[\d.]+)*)\s+\]"
    return re.sub(numbers, lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


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
    ans = with_context(ans)
    several = ans["context"].nunique() > 1
    for (layout, context), part in ans.groupby(["layout", "context"], sort=False):
        at = f", {context} tokens cached before each prompt" if several or context else ""
        lines += [f"## Layout `{layout}`{at}", "",
                  "| B | best static K | speed-up | best threshold | speed-up | τ 0.4 / 20 | share of static | share of "
                  "threshold | batch stop | SGLang shared | τ 0.4 / 20, free | best dynamic |", "|" + "---|" * 12]
        for _, a in part.iterrows():
            lines.append(f"| {a.batch} | {a.best_static} | {_f(a.best_static_speedup)} | {a.best_threshold} | "
                         f"{_f(a.best_threshold_speedup)} | {_f(a.reference_speedup)} | "
                         f"{_f(a.reference_share_of_static, True)} | {_f(a.reference_share_of_threshold, True)} | "
                         f"{_f(a.batchstop_speedup)} | {_f(a.sglang_speedup)} | {_f(a.free_reference_speedup)} | "
                         f"{a.best_dynamic} "
                         f"{_f(a.best_dynamic_speedup)} |")
        off = no_speculation_from(ans, layout, context=context)
        static_off = no_speculation_from(part.assign(static_pays=part["best_static_speedup"] > 1.0), layout,
                                         "static_pays", context)
        lines += ["", f"No speculation pays from B = {off}." if off else "Some speculation pays at every measured B.",
                  f"No static K pays from B = {static_off}." if static_off else "A static K pays at every measured B.",
                  "", "Schedules to take away:", "", "```json", to_json(schedules(ans, layout, context)),
                  "```", ""]
    if several:
        lines += by_context_markdown(ans)
    open_loop = with_context(rows[(rows["arrival"] != "closed") & (rows["split"] == rows["split"].iloc[-1])])
    if not open_loop.empty:
        ctx = several or bool(open_loop["context"].any())  # a column of its own where the study had contexts
        lines += ["## Poisson arrivals (largest B as the slot cap)", "",
                  "| layout | " + ("context | " if ctx else "") + "rate | setting | tokens/s | speed-up | TPOT p50 / p99 ms"
                  " | TTFT p50 ms | goodput req/s |", "|---|" + ("---|" if ctx else "") + "---|---|---|---|---|---|---|"]
        keep = open_loop[open_loop["strategy"].isin([BASELINE, REFERENCE]) | open_loop["kind"].eq("batchstop")]
        for _, r in keep.iterrows():
            lines.append(f"| {r.layout} | " + (f"{r.context} | " if ctx else "") + f"{r.arrival} | {r.strategy} | "
                         f"{r.tokens_per_s:.1f} | {_f(r.speedup)} | {r.tpot_ms_p50:.1f} / {r.tpot_ms_p99:.1f} | "
                         f"{r.ttft_ms_p50:.1f} | {r.goodput_rps:.3f} |")
    return "\n".join(lines) + "\n"


def by_context_markdown(ans: pd.DataFrame) -> list[str]:
    """Per layout, the best static K and τ 0.4 / 20's speed-up at each cached context, side by side (RFC #48627's
    question: does the context change the answer?), and vLLM's batch x context schedule."""
    lines = ["## By context length", "",
             "Each context: tokens every sequence holds cached before its prompt (a prefix cached before the request "
             "came: every pass reads it, none prefills it); acceptance stays the tables'. Best static K (test speed-up) "
             "and τ 0.4 / 20's speed-up per batch size.", ""]
    contexts = sorted(ans["context"].unique())
    for layout in ans["layout"].unique():
        part = ans[ans["layout"] == layout]
        lines += [f"### Layout `{layout}`", "", "| B | " + " | ".join(f"context {c}" for c in contexts) + " |",
                  "|---|" + "---|" * len(contexts)]
        for batch in sorted(part["batch"].unique()):
            cells = []
            for c in contexts:
                hit = part[(part["batch"] == batch) & (part["context"] == c)]
                a = hit.iloc[0] if len(hit) else None
                cells.append("-" if a is None else f"{a.best_static} {_f(a.best_static_speedup)}, τ 0.4 / 20 "
                                                   f"{_f(a.reference_speedup)}")
            lines.append(f"| {batch} | " + " | ".join(cells) + " |")
        ks = {c: _static_ks(_part(ans, layout, c)) for c in contexts}  # K 0 where no static K pays, as scheduled
        changed = [int(b) for b in sorted(part["batch"].unique()) if len({k.get(int(b)) for k in ks.values()}) > 1]
        lines += ["", f"The best static K changes with the context at B = {', '.join(map(str, changed))}."
                  if changed else "The best static K is the same at every context.", "",
                  "vLLM, batch x context (PR #48944, open):", "", "```json",
                  to_json(vllm_batch_x_context(ans, layout)), "```", ""]
    return lines


def heatmaps(rows: pd.DataFrame, label: str):
    """Test-split speed-up as heatmaps, one row per layout (and cached context where the study had several): batch
    size x static K, batch size x τ (thresholds at their KMAX), labelled with the costs' source."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    closed = with_context(rows[rows["arrival"] == "closed"])
    test = closed[closed["split"] == ("test" if (closed["split"] == "test").any() else closed["split"].iloc[0])]
    keys = list(dict.fromkeys(zip(test["layout"], test["context"])))
    plain = test["context"].nunique() == 1 and not test["context"].any()  # one study at context 0: no context named
    named = {key: key[0] if plain else f"{key[0]}, context {key[1]}" for key in keys}
    fig = make_subplots(rows=len(keys), cols=2, vertical_spacing=0.3 / max(1, len(keys)),
                        subplot_titles=[f"{named[key]}: B x {what}" for key in keys for what in ("static K", "τ")])
    for r, (layout, context) in enumerate(keys, start=1):
        for col, kind in ((1, "static"), (2, "threshold")):
            part = test[(test["kind"] == kind) & (test["layout"] == layout) & (test["context"] == context)].copy()
            if part.empty:
                continue
            part["param"] = part["strategy"].str.split(":").str[1].astype(float)
            grid = part.pivot_table(index="param", columns="batch", values="speedup")
            fig.add_trace(go.Heatmap(z=grid.values, x=[str(b) for b in grid.columns], y=[f"{v:g}" for v in grid.index],
                                     coloraxis="coloraxis", hovertemplate="B %{x}, %{y}: %{z:.2f}x<extra></extra>"),
                          row=r, col=col)
    fig.update_layout(title=f"Speed-up over the target alone per batch size, test prompts ({label})",
                      coloraxis=dict(colorscale="RdBu", cmid=1.0), height=320 * len(keys) + 80)
    return fig


def band_table(answers: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (layout, B), the answer's spread over a roofline's band (``answers``: the answer under each model of the
    band, by its note; "nominal" first): the best static K and best τ as intervals, speculation paying or not, and
    ``flips`` where a conclusion changes inside the band."""
    answers = {note: with_context(ans) for note, ans in answers.items()}
    nominal = answers["nominal"]
    rows = []
    for _, a in nominal.iterrows():
        same = [ans[(ans["layout"] == a.layout) & (ans["context"] == a.context) & (ans["batch"] == a.batch)].iloc[0]
                for ans in answers.values()]
        ks = [int(s.best_static.split(":")[1]) for s in same if isinstance(s.best_static, str)]
        taus = [float(s.best_threshold.split(":")[1]) for s in same if isinstance(s.best_threshold, str)]
        pays = {bool(s.speculation_pays) for s in same}
        near = {bool(s.reference_near) for s in same}
        reference_pays = {bool(s.reference_speedup > 1.0) for s in same}
        rows.append({"layout": a.layout, "context": int(a.context), "batch": int(a.batch), "best_static": a.best_static,
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
             "| layout | context | B | best static K (band) | best τ (band) | τ 0.4 / 20 speed-up (band) | flips |",
             "|---|---|---|---|---|---|---|"]
    for _, b in band.assign(context=band.get("context", 0)).iterrows():
        lines.append(f"| {b.layout} | {b.context} | {b.batch} | {b.best_static} ({b.k_low:g}-{b.k_high:g}) | {b.best_threshold} "
                     f"({b.tau_low:g}-{b.tau_high:g}) | {_f(b.reference_speedup_low)}-{_f(b.reference_speedup_high)} "
                     f"| {'**yes**' if b.flips else 'no'} |")
    return "\n".join(lines) + "\n"
