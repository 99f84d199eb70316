"""Benchmarks: static vs dynamic lookahead on a prompt suite, by exact replay and by timed runs.

``python -m disco bench`` (or ``python -m disco.bench``):
  * replay (greedy): per prompt, the target's greedy output and the assistant's chains along it are
    computed once (``disco.replay``, cached on disk); every setting of the grid is replayed exactly
    and its time estimated from per-pass costs measured on this machine (``costs.calibrate``);
  * timed: real end-to-end runs of a short list of strategies with our engine and, back to back,
    transformers' own ``generate(assistant_model=...)`` with matching settings (the peer), interleaved
    per prompt (A B, B A, ...) so drift on a noisy machine hits both alike; models warmed up once;
  * validation: for the timed strategies, replay's predicted iterations and target passes must equal
    the real run's, and predicted seconds must be within ``TIME_TOLERANCE`` of measured.
Outputs (``--out``): runs.csv, summary.csv, summary.md, theory.csv, validation.csv, heatmap.html,
heatmap.svg (PNG needs kaleido, which is not a dependency), timed_iterations.csv, meta.json.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd

from disco.engine import Interrupted
from disco.policies import Oracle, StrategyError, parse_strategy
from disco import costs as cost_mod
from disco.costs import CostModel, cached_costs
from disco.divergence import explain as explain_divergence
from disco.divergence import short as divergence_short
from disco.replay import AUTOREGRESSIVE, KMAXES, STATIC_KS, TAUS, ReplayError, build_table, default_grid, replay_many
from disco.trace import iterations_frame, summarize, theory_speedup, theory_tokens_per_iteration

EXIT_USAGE = 2
DEFAULT_SUITE = Path(__file__).resolve().parent.parent / "assets" / "suite.json"
KINDS = ("code", "explanation", "summarisation", "prose")
TIME_TOLERANCE = 0.15  # predicted vs measured seconds, per strategy summed over the timed prompts
REFERENCE_SETTING = "threshold:0.4:20"  # transformers' defaults (DISCO's recommendation)
PEER_PREFIX = "hf:"


class BenchError(ValueError):
    """A user-facing benchmark error (one line on stderr, exit 2)."""


# ---------------------------------------------------------------------------------------------
# the prompt suite


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    kind: str
    chat: bool
    prompt: str


def load_suite(path: str | os.PathLike | None = None) -> list[SuitePrompt]:
    """Read a suite (.json with a "prompts" list, a bare list, or .jsonl). Checks ids, kinds and texts."""
    path = Path(path) if path else DEFAULT_SUITE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"cannot read suite {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".jsonl":
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            items = data["prompts"] if isinstance(data, dict) else data
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"suite {path} is not valid JSON of prompts: {exc}") from None
    prompts, seen = [], set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BenchError(f"suite {path}: entry {i} is not an object")
        pid, kind, prompt = item.get("id"), item.get("kind"), item.get("prompt")
        if not isinstance(pid, str) or not pid.strip():
            raise BenchError(f"suite {path}: entry {i} has no id")
        if pid in seen:
            raise BenchError(f"suite {path}: duplicate id {pid!r}")
        if not isinstance(kind, str) or not kind.strip():
            raise BenchError(f"suite {path}: prompt {pid!r} has no kind")
        if not isinstance(prompt, str) or not prompt.strip():
            raise BenchError(f"suite {path}: prompt {pid!r} is empty")
        seen.add(pid)
        prompts.append(SuitePrompt(pid, kind, bool(item.get("chat", False)), prompt))
    if not prompts:
        raise BenchError(f"suite {path} has no prompts")
    return prompts


def pick_prompts(prompts: list[SuitePrompt], count: int | None) -> list[SuitePrompt]:
    """``count`` prompts spread over the kinds (round-robin in suite order); all when count is None."""
    if count is None or count >= len(prompts):
        return list(prompts)
    by_kind: dict[str, list[SuitePrompt]] = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    chosen: list[SuitePrompt] = []
    while len(chosen) < count:
        for kind in list(by_kind):
            if by_kind[kind] and len(chosen) < count:
                chosen.append(by_kind[kind].pop(0))
    order = {p.id: i for i, p in enumerate(prompts)}
    return sorted(chosen, key=lambda p: order[p.id])


def filter_prompts(prompts: list[SuitePrompt], selection: str | None) -> list[SuitePrompt]:
    """Keep prompts whose id or kind is in a comma-separated selection."""
    if not selection:
        return prompts
    wanted = {s.strip() for s in selection.split(",") if s.strip()}
    kept = [p for p in prompts if p.id in wanted or p.kind in wanted]
    unknown = wanted - {p.id for p in prompts} - {p.kind for p in prompts}
    if unknown:
        raise BenchError(f"unknown prompt id or kind: {sorted(unknown)[0]}")
    return kept


# ---------------------------------------------------------------------------------------------
# environment


def sklearn_available() -> bool:
    """transformers adapts the confidence threshold with an ROC curve when scikit-learn is importable."""
    try:
        from transformers.utils import is_sklearn_available

        return bool(is_sklearn_available())
    except ImportError:
        return False


def environment(pair, info: dict | None = None) -> dict:
    """The run's models (``pair.describe()``, or ``info`` when the models are not loaded) and this machine."""
    import torch
    import transformers

    info = dict(pair.describe() if pair is not None else info or {})
    from disco.calibration import cpu_info, flags_line

    info.update(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                sklearn_available=sklearn_available(), threads=torch.get_num_threads(),
                cpu=cpu_info()["cpu"], cpu_flags=" ".join(cpu_info()["flags"]),
                onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA", ""), machine=flags_line())
    return info


# ---------------------------------------------------------------------------------------------
# replay mode


def _spec_parts(spec: str) -> tuple[str, float | None, int | None]:
    policy = parse_strategy(spec)
    tau = getattr(policy, "tau", None)
    k = getattr(policy, "k", None)
    return policy.kind, tau, k


def replay_rows(prompt: SuitePrompt, table, results: dict, base_meta: dict) -> list[dict]:
    """One runs.csv row per strategy replayed on one prompt."""
    ar = results.get(AUTOREGRESSIVE)
    ar_seconds = ar.summary()["seconds"] if ar is not None else math.nan
    rows = []
    for spec, res in results.items():
        s = res.summary()
        s["decode_seconds"] = s["seconds"] - s["ttft_ms"] / 1000.0
        identical = res.output_ids == table.reference_for(base_meta["max_new_tokens"])  # true by construction
        rows.append(_row(prompt, spec, "replay", "ours", s, identical, ar_seconds, base_meta,
                         assistant_passes=s["draft_calls"], prompt_tokens=len(table.prompt_ids)))
    return rows


def _row(prompt: SuitePrompt, strategy: str, mode: str, implementation: str, s: dict, identical, ar_seconds: float,
         meta: dict, **extra) -> dict:
    seconds = s["seconds"]
    row = {
        "prompt_id": prompt.id, "kind": prompt.kind, "chat": prompt.chat, "strategy": strategy, "mode": mode,
        "implementation": implementation, "seconds": seconds, "new_tokens": s["new_tokens"],
        "iterations": s.get("iterations"), "target_passes": s["target_calls"],
        "assistant_passes": extra.pop("assistant_passes", s.get("draft_calls")), "drafted": s.get("drafted"),
        "accepted": s.get("accepted"), "acceptance_rate": s.get("acceptance_rate"),
        "mean_lookahead": s.get("mean_lookahead"), "identical_to_autoregressive": identical,
        "speedup": ar_seconds / seconds if seconds and seconds > 0 and ar_seconds == ar_seconds else math.nan,
        "overhead_pct": s.get("overhead_pct", math.nan),
        "ttft_seconds": s["ttft_ms"] / 1000.0 if s.get("ttft_ms") is not None else math.nan,
        "decode_seconds": s.get("decode_seconds", math.nan),
    }
    row.update(extra)
    for key in ("models", "dtype", "device", "assistant_precision", "torch", "transformers", "sklearn_available", "max_new_tokens"):
        row[key] = meta.get(key)
    return row


def prepare_table(pair, prompt: SuitePrompt, specs: list[str], max_new_tokens: int, cache_dir: Path | None):
    """Build (or load) one prompt's table and make sure it holds every chain token ``specs`` need."""
    from disco.race import encode_prompt

    ids = encode_prompt(pair, prompt.prompt, prompt.chat, max_new_tokens)
    table = build_table(pair, ids, max_new_tokens, cache_dir, name=prompt.id)
    results = replay_many(table, specs, max_new_tokens)
    hits, total = table.first_token_agreement(max_new_tokens)
    table.meta["alpha_hits"], table.meta["alpha_positions"] = hits, total
    if table.builder is not None and table.builder.passes:
        table.meta["chain_passes"] = table.meta.get("chain_passes", 0) + table.builder.passes
        table.meta["chain_seconds"] = table.meta.get("chain_seconds", 0.0) + table.builder.ms / 1000.0
        table.builder.passes, table.builder.ms = 0, 0.0
    if table.dirty:
        table.save()
    return table, results


def replay_prompt(pair, prompt: SuitePrompt, specs: list[str], max_new_tokens: int, costs: CostModel,
                  cache_dir: Path | None, meta: dict) -> tuple[list[dict], object, dict]:
    """Build (or load) one prompt's table, replay every spec with estimated times, return (rows, table, results)."""
    table, _ = prepare_table(pair, prompt, specs, max_new_tokens, cache_dir)
    results = replay_many(table, specs, max_new_tokens, costs)
    return replay_rows(prompt, table, results, meta), table, results


# ---------------------------------------------------------------------------------------------
# timed mode: our engine and transformers' assisted generation


def hf_settings(spec: str) -> dict | None:
    """transformers' knobs for a strategy (set on assistant_model.generation_config); None when it has no peer."""
    policy = parse_strategy(spec)
    if policy.kind == "autoregressive":
        return {}
    if policy.kind == "static":
        return dict(num_assistant_tokens=policy.k, assistant_confidence_threshold=0.0,
                    num_assistant_tokens_schedule="constant")
    if policy.kind == "heuristic":
        return dict(num_assistant_tokens=policy.k, assistant_confidence_threshold=0.0,
                    num_assistant_tokens_schedule="heuristic")
    if policy.kind == "threshold":
        return dict(num_assistant_tokens=policy.k, assistant_confidence_threshold=policy.tau,
                    num_assistant_tokens_schedule="constant")
    return None  # oracle: transformers has no such mode


def run_ours(pair, prompt_ids: list[int], spec: str, max_new_tokens: int, reference: list[int] | None = None) -> dict:
    import time as _time

    from disco.engine import Decoder, DecodeSettings

    policy = parse_strategy(spec)
    if isinstance(policy, Oracle):
        if reference is None:
            from disco.race import greedy_reference

            reference = greedy_reference(pair, prompt_ids, max_new_tokens)
        policy.reference = list(reference)
    start = _time.perf_counter()
    decoder = Decoder(pair, list(prompt_ids), policy, DecodeSettings(max_new_tokens=max_new_tokens))
    decoder.run()
    seconds = _time.perf_counter() - start
    summary = summarize(spec, iterations_frame(decoder.records))
    summary["decode_seconds"] = summary["seconds"] - summary["ttft_ms"] / 1000.0  # after the first iteration
    summary["seconds"] = seconds  # wall time of the whole call, as for the peer
    return {"summary": summary, "output_ids": decoder.output_ids, "records": decoder.records, "tokens": decoder.tokens,
            "dtype": pair.dtype_name}


def run_hf(pair, prompt_ids: list[int], spec: str, max_new_tokens: int) -> dict:
    """transformers' ``generate`` (greedy) with the assistant configured like ``spec``; passes counted with hooks."""
    import time as _time

    import torch

    settings = hf_settings(spec)
    if settings is None:
        raise BenchError(f"strategy {spec!r} has no transformers peer")
    gc = pair.assistant.generation_config
    keys = ("num_assistant_tokens", "assistant_confidence_threshold", "num_assistant_tokens_schedule")
    saved = {k: getattr(gc, k, None) for k in keys}
    counts = {"target": 0, "assistant": 0}

    def counter(role):
        def hook(module, args, output):
            counts[role] += 1
        return hook

    hooks = [pair.target.register_forward_hook(counter("target")),
             pair.assistant.register_forward_hook(counter("assistant"))]
    eos = list(pair.eos_ids)
    pad = getattr(pair.tokenizer, "pad_token_id", None)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, repetition_penalty=1.0,
                  eos_token_id=eos, pad_token_id=pad if pad is not None else eos[0])
    try:
        for k, v in settings.items():
            setattr(gc, k, v)
        x = torch.tensor([list(prompt_ids)], dtype=torch.long, device=pair.device)
        mask = torch.ones_like(x)
        with torch.inference_mode():
            if pair.device.type == "cuda":
                torch.cuda.synchronize(pair.device)
            start = _time.perf_counter()
            out = pair.target.generate(input_ids=x, attention_mask=mask,
                                       assistant_model=pair.assistant if settings else None, **kwargs)
            if pair.device.type == "cuda":
                torch.cuda.synchronize(pair.device)
            seconds = _time.perf_counter() - start
    finally:
        for h in hooks:
            h.remove()
        for k, v in saved.items():
            setattr(gc, k, v)
    output = out[0, len(prompt_ids):].tolist()
    for i, token in enumerate(output):  # generate stops at EOS; be safe about padding
        if token in pair.eos_ids:
            output = output[: i + 1]
            break
    return {"seconds": seconds, "output_ids": output, "target_passes": counts["target"],
            "assistant_passes": counts["assistant"]}


def warm_up(pair, prompt_ids: list[int]) -> None:
    """Warm both models and both code paths once (lazy initialisation must not be timed)."""
    pair.warmup()
    short = list(prompt_ids)[:16] or [pair.eos_ids[0]]
    run_ours(pair, short, "threshold:0.4:5", 4)
    run_hf(pair, short, "threshold:0.4:5", 4)
    run_hf(pair, short, AUTOREGRESSIVE, 2)


def timed_prompt(pair, prompt: SuitePrompt, specs: list[str], max_new_tokens: int, meta: dict, reps: int = 1,
                 reference: list[int] | None = None, peer: bool = True, order_offset: int = 0) -> tuple[list[dict], list]:
    """Run ours and the peer back to back for every strategy (A B B A ...), ``reps`` times.

    Returns the runs.csv rows (median seconds over reps) and our engine's per-iteration records."""
    from disco.race import encode_prompt

    ids = encode_prompt(pair, prompt.prompt, prompt.chat, max_new_tokens)
    measured: dict[tuple[str, str], list[dict]] = {}
    records = []
    for rep in range(reps):
        for i, spec in enumerate(specs):
            # A B, then B A: alternating who goes first cancels a linear drift of the machine's speed
            order = ("ours", "hf") if (i + rep + order_offset) % 2 == 0 else ("hf", "ours")
            for impl in order:
                if impl == "ours":
                    ours = run_ours(pair, ids, spec, max_new_tokens, reference)
                    measured.setdefault(("ours", spec), []).append(ours)
                    for r in ours["records"]:
                        records.append({"prompt_id": prompt.id, "rep": rep, **r.__dict__})
                elif peer and hf_settings(spec) is not None:
                    measured.setdefault(("hf", spec), []).append(run_hf(pair, ids, spec, max_new_tokens))
    base = {impl: measured.get((impl, AUTOREGRESSIVE)) for impl in ("ours", "hf")}
    truth = base["ours"][0]["output_ids"] if base["ours"] else reference
    rows = []
    for (impl, spec), runs in measured.items():
        seconds = statistics.median(r["seconds"] if impl == "hf" else r["summary"]["seconds"] for r in runs)
        ar_runs = base[impl]
        ar_seconds = (statistics.median(r["seconds"] if impl == "hf" else r["summary"]["seconds"] for r in ar_runs)
                      if ar_runs else math.nan)
        first = runs[0]
        identical = (first["output_ids"] == truth) if truth is not None else None
        if impl == "ours":
            s = dict(first["summary"], seconds=seconds,
                     decode_seconds=statistics.median(r["summary"]["decode_seconds"] for r in runs))
            div = None
            if identical is False and base["ours"]:  # explained from both runs' own logits (disco.divergence)
                div = explain_divergence(base["ours"][0]["tokens"], first["tokens"], first["dtype"])
            rows.append(_row(prompt, spec, "timed", "ours", s, identical, ar_seconds, meta,
                             prompt_tokens=len(ids), reps=len(runs),
                             divergence=div["kind"] if div else "", divergence_detail=divergence_short(div)))
        else:
            ours_out = measured.get(("ours", spec), [{}])[0].get("output_ids")
            new_tokens = len(first["output_ids"])
            s = {"seconds": seconds, "new_tokens": new_tokens, "ttft_ms": None, "iterations": first["target_passes"],
                 "target_calls": first["target_passes"], "draft_calls": first["assistant_passes"], "drafted": None,
                 "accepted": None, "acceptance_rate": math.nan, "mean_lookahead": math.nan, "overhead_pct": math.nan}
            rows.append(_row(prompt, PEER_PREFIX + spec, "timed", "hf", s, identical, ar_seconds, meta,
                             prompt_tokens=len(ids), reps=len(runs), same_as_ours=first["output_ids"] == ours_out))
    return rows, records


# ---------------------------------------------------------------------------------------------
# summaries


def geomean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None and v == v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def add_decode_speedup(runs: pd.DataFrame) -> pd.DataFrame:
    """decode_speedup: the speed-up of the decode loop alone (prefill, i.e. iteration 1, excluded), against
    the autoregressive run of the same prompt, mode and implementation (NaN for the peer: not measurable)."""
    if runs.empty or "decode_seconds" not in runs:
        return runs
    runs = runs.copy()
    is_ar = runs["strategy"].isin([AUTOREGRESSIVE, PEER_PREFIX + AUTOREGRESSIVE])
    base = runs[is_ar].set_index(["mode", "implementation", "prompt_id"])["decode_seconds"]
    keys = list(zip(runs["mode"], runs["implementation"], runs["prompt_id"]))
    ar = pd.Series([base.get(k, math.nan) for k in keys], index=runs.index, dtype=float)
    runs["decode_speedup"] = ar / pd.to_numeric(runs["decode_seconds"], errors="coerce")
    return runs


def _divergence_counts(rows: pd.DataFrame) -> str:
    """``near-tie 2, mismatch 0``-style counts of the explained divergences among ``rows`` ('' when none)."""
    if "divergence" not in rows:
        return ""
    kinds = rows["divergence"].dropna().astype(str)
    counts = kinds[kinds != ""].value_counts()
    return ", ".join(f"{k} {n}" for k, n in counts.items())


def summarize_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per mode x strategy x kind ("all" + each kind): geometric-mean speed-up with its spread."""
    out = []
    if runs.empty:
        return pd.DataFrame()
    runs = add_decode_speedup(runs)
    for (mode, strategy), group in runs.groupby(["mode", "strategy"], sort=False):
        for kind, rows in [("all", group)] + list(group.groupby("kind", sort=True)):
            sp = rows["speedup"].astype(float)
            ident = rows["identical_to_autoregressive"]
            out.append({
                "mode": mode, "strategy": strategy, "implementation": rows["implementation"].iloc[0], "kind": kind,
                "prompts": len(rows), "speedup_geomean": geomean(sp), "speedup_min": sp.min(), "speedup_max": sp.max(),
                "decode_speedup_geomean": geomean(rows["decode_speedup"].astype(float)),
                "seconds_total": float(rows["seconds"].sum()), "new_tokens_total": int(rows["new_tokens"].sum()),
                "target_passes_total": int(rows["target_passes"].sum()),
                "assistant_passes_total": int(pd.to_numeric(rows["assistant_passes"], errors="coerce").fillna(0).sum()),
                "acceptance_rate_mean": float(pd.to_numeric(rows["acceptance_rate"], errors="coerce").mean()),
                "mean_lookahead_mean": float(pd.to_numeric(rows["mean_lookahead"], errors="coerce").mean()),
                "all_identical": bool(ident.dropna().astype(bool).all()) if ident.notna().any() else None,
                "divergences": _divergence_counts(rows),
                "overhead_pct_mean": float(pd.to_numeric(rows["overhead_pct"], errors="coerce").mean()),
            })
    return pd.DataFrame(out)


def _overall(summary: pd.DataFrame, mode: str = "replay") -> pd.DataFrame:
    if summary.empty:
        return summary
    return summary[(summary["mode"] == mode) & (summary["kind"] == "all")].set_index("strategy")


def best_settings(summary: pd.DataFrame, column: str = "speedup_geomean") -> dict:
    """The best static K, the best threshold setting and friends, from replay's overall geomean speed-ups."""
    overall = _overall(summary)
    if overall.empty or column not in overall:
        return {}
    sp = overall[column]
    kinds = {s: s.split(":", 1)[0] for s in sp.index}
    def best(kind):
        cands = sp[[s for s in sp.index if kinds[s] == kind]].dropna()
        return (cands.idxmax(), float(cands.max())) if not cands.empty else (None, math.nan)
    out = {}
    for kind in ("static", "threshold", "heuristic", "oracle"):
        spec, value = best(kind)
        out[f"best_{kind}"], out[f"best_{kind}_speedup"] = spec, value
    out["reference"] = REFERENCE_SETTING
    out["reference_speedup"] = float(sp.get(REFERENCE_SETTING, math.nan))
    return out


def heatmap_grid(summary: pd.DataFrame) -> tuple[list[float], list[int], list[list[float]]]:
    """(taus, kmaxes, z[tau][kmax]) of replay geomean speed-ups over the threshold settings."""
    overall = _overall(summary)
    cells = {}
    for spec, row in overall.iterrows() if not overall.empty else []:
        if spec.startswith("threshold:"):
            kind, tau, k = _spec_parts(spec)
            cells[(tau, k)] = row["speedup_geomean"]
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
    marks = []
    if REFERENCE_SETTING.startswith("threshold:"):
        marks.append((0.4, 20, "τ=0.4, KMAX=20", "#111827"))
    bt = best.get("best_threshold")
    if bt:
        _, tau, k = _spec_parts(bt)
        marks.append((tau, k, f"best {bt}", "#16a34a"))
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
    best_cell = _spec_parts(bt)[1:] if bt else None
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
            elif (tau, k) == (0.4, 20):
                stroke = "#111827"
            if stroke:
                out.append(f'<rect x="{x + 1.5}" y="{y + 1.5}" width="{cw - 3}" height="{ch - 3}" fill="none" '
                           f'stroke="{stroke}" stroke-width="2.5"/>')
    out.append("</svg>")
    return "\n".join(out)


def theory_frame(alpha: float, c: float, costs: CostModel | None, summary: pd.DataFrame,
                 ks: Iterable[int] = range(1, 21)) -> pd.DataFrame:
    """Leviathan et al.'s predicted speed-up per static K beside replay's (measured-cost) answer.

    ``theory_speedup`` assumes verifying k+1 tokens costs one target step; the second column uses the
    measured verification cost t_target(k+1) instead, which matters on CPUs where it grows with k.
    """
    overall = _overall(summary)
    rows = []
    for k in ks:
        tokens = theory_tokens_per_iteration(alpha, k)
        cost_aware = math.nan
        if costs is not None:
            t1 = costs.target_ms(1)
            cost_aware = tokens * t1 / (k * costs.assistant_ms(1) + costs.target_ms(k + 1))
        spec = f"static:{k}"
        rows.append({"K": k, "alpha": alpha, "c": c, "theory_tokens_per_iteration": tokens,
                     "theory_speedup": theory_speedup(alpha, k, c), "theory_speedup_measured_verify": cost_aware,
                     "replay_speedup": float(overall["speedup_geomean"].get(spec, math.nan)) if not overall.empty else math.nan})
    return pd.DataFrame(rows)


def validation_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """For every timed run of ours: replay's prediction beside the measurement."""
    timed = runs[(runs["mode"] == "timed") & (runs["implementation"] == "ours")]
    rep = runs[runs["mode"] == "replay"].set_index(["prompt_id", "strategy"])
    rows = []
    for _, t in timed.iterrows():
        key = (t["prompt_id"], t["strategy"])
        if key not in rep.index:
            continue
        p = rep.loc[key]
        rows.append({
            "prompt_id": t["prompt_id"], "strategy": t["strategy"],
            "iterations_predicted": int(p["iterations"]), "iterations_measured": int(t["iterations"]),
            "target_passes_predicted": int(p["target_passes"]), "target_passes_measured": int(t["target_passes"]),
            "assistant_passes_predicted": int(p["assistant_passes"]), "assistant_passes_measured": int(t["assistant_passes"]),
            "seconds_predicted": float(p["seconds"]), "seconds_measured": float(t["seconds"]),
            "time_error_pct": 100.0 * (float(p["seconds"]) - float(t["seconds"])) / float(t["seconds"]),
            "exact": int(p["iterations"]) == int(t["iterations"]) and int(p["target_passes"]) == int(t["target_passes"]),
            "identical_to_autoregressive": t["identical_to_autoregressive"],
            "divergence": t.get("divergence_detail", "") if isinstance(t.get("divergence_detail", ""), str) else "",
        })
    return pd.DataFrame(rows)


def validation_outcome(val: pd.DataFrame) -> dict:
    if val.empty:
        return {"checked": 0}
    per = val.groupby("strategy")[["seconds_predicted", "seconds_measured"]].sum()
    err = 100.0 * (per["seconds_predicted"] - per["seconds_measured"]) / per["seconds_measured"]
    total_err = 100.0 * (val["seconds_predicted"].sum() - val["seconds_measured"].sum()) / val["seconds_measured"].sum()
    return {
        "checked": len(val), "exact": int(val["exact"].sum()),
        "exact_assistant": int((val["assistant_passes_predicted"] == val["assistant_passes_measured"]).sum()),
        "time_error_pct_by_strategy": {k: round(float(v), 2) for k, v in err.items()},
        "time_error_pct_total": round(float(total_err), 2),
        "time_error_pct_rows_median_abs": round(float(val["time_error_pct"].abs().median()), 2),
        "tolerance_pct": 100 * TIME_TOLERANCE,
        "counts_ok": bool(val["exact"].all()),
        "time_ok": bool((err.abs() <= 100 * TIME_TOLERANCE).all()),
        "passed": bool(val["exact"].all() and (err.abs() <= 100 * TIME_TOLERANCE).all()),
    }


def peer_frame(summary: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Ours against transformers on the same settings (timed prompts only)."""
    timed = runs[runs["mode"] == "timed"]
    rows = []
    for spec in timed.loc[timed["implementation"] == "ours", "strategy"].unique():
        ours = timed[(timed["strategy"] == spec) & (timed["implementation"] == "ours")]
        hf = timed[timed["strategy"] == PEER_PREFIX + spec]
        if hf.empty:
            continue
        merged = ours.merge(hf, on="prompt_id", suffixes=("_ours", "_hf"))
        rows.append({
            "strategy": spec, "prompts": len(merged),
            "seconds_ours": float(merged["seconds_ours"].sum()), "seconds_hf": float(merged["seconds_hf"].sum()),
            "ratio_ours_over_hf": float(merged["seconds_ours"].sum() / merged["seconds_hf"].sum()),
            "ratio_median_per_prompt": float((merged["seconds_ours"] / merged["seconds_hf"]).median()),
            "speedup_ours": geomean(merged["speedup_ours"]), "speedup_hf": geomean(merged["speedup_hf"]),
            "same_text": bool(merged["same_as_ours_hf"].astype(bool).all()),
            "equal_target_passes": bool((merged["target_passes_ours"] == merged["target_passes_hf"]).all()),
            "target_passes_ours": int(merged["target_passes_ours"].sum()),
            "target_passes_hf": int(merged["target_passes_hf"].sum()),
            "overhead_pct_ours": float(pd.to_numeric(merged["overhead_pct_ours"], errors="coerce").mean()),
        })
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# summary.md


def _fmt(v, spec=".2f", dash="—") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return dash
    if isinstance(v, bool):
        return "yes" if v else "no"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _identical_cell(row) -> str:
    cell = _fmt(row.identical_to_autoregressive)
    detail = getattr(row, "divergence", "")
    return f"{cell} ({detail})" if detail and isinstance(detail, str) else cell


def _cost_sentence(meta: dict) -> str:
    name = meta.get("cost_profile", cost_mod.MEASURED)
    if name == cost_mod.MEASURED:
        return "Replay seconds are estimated from per-pass costs measured on this machine (cost profile `measured`)."
    if str(name).startswith("flat:"):
        return (f"Cost profile `{name}`: replay time counts every target pass as one step and every assistant pass as "
                f"{name.split(':', 1)[1]} of a step (verification free, as on a GPU with a tiny draft); the "
                "iterations are the exact replay of this pair, only the costs are hypothetical.")
    return f"Cost profile `{name}`: replay seconds use per-pass costs read from that CSV (measured elsewhere)."


def summary_markdown(meta: dict, summary: pd.DataFrame, theory: pd.DataFrame | None, validation: dict,
                     val: pd.DataFrame, peers: pd.DataFrame) -> str:
    best = meta.get("best", {})
    parts = [f"# DISCO Lab benchmark: {meta.get('models')} ({meta.get('dtype')}, {meta.get('device')}, "
             f"{meta.get('assistant_precision', 'model')} assistant)", ""]
    parts.append(
        f"Command: `{meta.get('command')}`  \n"
        f"Machine: {meta.get('machine', meta.get('cpu'))}  \n"
        f"Suite: {meta.get('suite')} ({meta.get('prompts_replayed', 0)} prompts replayed, "
        f"{meta.get('prompts_timed', 0)} timed), max_new_tokens={meta.get('max_new_tokens')}, greedy.  \n"
        f"Versions: torch {meta.get('torch')}, transformers {meta.get('transformers')}, python {meta.get('python')}; "
        f"threads {meta.get('threads')}; scikit-learn installed: {_fmt(meta.get('sklearn_available'))} "
        f"(when installed, transformers adapts the threshold with an ROC curve; here it "
        f"{'did' if meta.get('sklearn_available') else 'did not'}).  \n"
        f"Speed-up = autoregressive seconds / strategy seconds per prompt; geometric mean over prompts "
        f"[min–max across prompts]; decode-only speed-up leaves out iteration 1 (prefill fused with the first "
        f"verification). {_cost_sentence(meta)}")
    overall = _overall(summary)
    if not overall.empty:
        parts += ["", "## Headline (replay, all prompts)", ""]
        top = max((v for k, v in best.items() if k.endswith("_speedup") and v == v), default=math.nan)
        rows = []
        labels = [("best static K", best.get("best_static")), ("τ = 0.4, KMAX = 20", REFERENCE_SETTING),
                  ("best threshold", best.get("best_threshold")), ("heuristic", best.get("best_heuristic")),
                  ("oracle (upper bound)", best.get("best_oracle"))]
        best_dyn = best.get("best_threshold_speedup", math.nan)
        for label, spec in labels:
            if not spec or spec not in overall.index:
                continue
            r = overall.loc[spec]
            rows.append([label, f"`{spec}`", f"{r['speedup_geomean']:.3f}x",
                         f"{r['speedup_min']:.2f}–{r['speedup_max']:.2f}", _fmt(r["decode_speedup_geomean"], ".3f") + "x",
                         _fmt(100 * (r['speedup_geomean'] / best_dyn - 1), "+.1f") + " %",
                         _fmt(r["acceptance_rate_mean"]), _fmt(r["mean_lookahead_mean"], ".1f")])
        parts.append(_md_table(["setting", "spec", "speed-up", "spread", "decode-only speed-up", "vs best threshold",
                                "acceptance", "mean lookahead"], rows))
        ref = best.get("reference_speedup", math.nan)
        dec = best_settings(summary, "decode_speedup_geomean")
        if dec:
            parts += ["", f"Decode loop only (iteration 1, which carries the prefill, excluded): best static "
                          f"`{dec['best_static']}` {_fmt(dec['best_static_speedup'])}x, `{REFERENCE_SETTING}` "
                          f"{_fmt(dec['reference_speedup'])}x, best threshold `{dec['best_threshold']}` "
                          f"{_fmt(dec['best_threshold_speedup'])}x, oracle {_fmt(dec['best_oracle_speedup'])}x."]
        parts += ["", f"τ = 0.4 / KMAX 20 reaches {_fmt(100 * ref / best_dyn, '.1f')} % of the best threshold "
                      f"setting's speed-up and {_fmt(100 * ref / best.get('best_static_speedup', math.nan), '.1f')} % of "
                      f"the best static K's (oracle: {_fmt(best.get('best_oracle_speedup'), '.2f')}x)."]
        kinds = [k for k in KINDS if k in set(summary["kind"])] + sorted(set(summary["kind"]) - set(KINDS) - {"all"})
        rs = summary[(summary["mode"] == "replay")]
        specs = [s for s in [AUTOREGRESSIVE, best.get("best_static"), REFERENCE_SETTING, best.get("best_threshold"),
                             best.get("best_heuristic"), best.get("best_oracle")] if s]
        specs = list(dict.fromkeys(specs))
        if kinds:
            parts += ["", "## By kind of prompt (replay, geometric-mean speed-up)", ""]
            rows = []
            for spec in specs:
                cells = []
                for kind in kinds:
                    r = rs[(rs["strategy"] == spec) & (rs["kind"] == kind)]
                    cells.append(_fmt(float(r["speedup_geomean"].iloc[0]), ".2f") if not r.empty else "—")
                    # best of each kind, for reference
                rows.append([f"`{spec}`"] + cells)
            best_row = []
            for kind in kinds:
                r = rs[(rs["kind"] == kind) & rs["strategy"].str.startswith(("static:", "threshold:"))]
                if r.empty:
                    best_row.append("—")
                else:
                    i = r["speedup_geomean"].idxmax()
                    best_row.append(f"{r.loc[i, 'speedup_geomean']:.2f} (`{r.loc[i, 'strategy']}`)")
            rows.append(["best static/threshold"] + best_row)
            parts.append(_md_table(["strategy"] + kinds, rows))
        taus, ks, z = heatmap_grid(summary)
        if taus:
            parts += ["", "## Heatmap: speed-up over τ × KMAX (replay)", "",
                      "![heatmap](heatmap.svg)", ""]
            rows = [[format(t, "g")] + [_fmt(v) for v in zrow] for t, zrow in zip(taus, z)]
            parts.append(_md_table(["τ \\ KMAX"] + [str(k) for k in ks], rows))
            static = [(s, overall.loc[s, "speedup_geomean"]) for s in overall.index if s.startswith("static:")]
            if static:
                parts += ["", "Static K: " + ", ".join(f"K={s.split(':')[1]}: {v:.2f}" for s, v in static)]
    if theory is not None and not theory.empty:
        alpha, c = theory["alpha"].iloc[0], theory["c"].iloc[0]
        kt = int(theory.loc[theory["theory_speedup"].idxmax(), "K"])
        km = int(theory.loc[theory["theory_speedup_measured_verify"].idxmax(), "K"]) if theory[
            "theory_speedup_measured_verify"].notna().any() else None
        rep = theory.dropna(subset=["replay_speedup"])
        kr = int(rep.loc[rep["replay_speedup"].idxmax(), "K"]) if not rep.empty else None
        parts += ["", "## Theory beside measurement (Leviathan et al. 2023)", "",
                  f"Measured per-token acceptance α = {alpha:.3f} (assistant's first draft = target's token, over all "
                  f"positions), cost ratio c = t_draft / t_target = {c:.3f}. The formula's optimal static K is "
                  f"**{kt}**; with the measured cost of verifying k+1 tokens it is **{km}**; replay's best static K "
                  f"is **{kr}**.", ""]
        rows = [[int(r.K), _fmt(r.theory_tokens_per_iteration), _fmt(r.theory_speedup), _fmt(r.theory_speedup_measured_verify),
                 _fmt(r.replay_speedup)] for r in theory.itertuples() if int(r.K) in set(STATIC_KS) | {kt}]
        parts.append(_md_table(["K", "E[tokens/iter]", "theory speed-up", "theory w/ measured verify cost",
                                "replay speed-up"], rows))
        costs = meta.get("costs")
        if costs:
            t = dict((int(n), ms) for n, ms in costs["target"])
            a = dict((int(n), ms) for n, ms in costs["assistant"])
            parts += ["", "Measured per-pass costs (median ms): target " +
                      ", ".join(f"{n} tok {ms:.0f}" for n, ms in sorted(t.items())) + "; assistant " +
                      ", ".join(f"{n} tok {ms:.0f}" for n, ms in sorted(a.items())) + "."]
    if peers is not None and not peers.empty:
        parts += ["", "## Our engine against transformers' assisted generation (timed, same prompts and settings)", ""]
        rows = [[f"`{r.strategy}`", r.prompts, _fmt(r.seconds_ours, ".1f"), _fmt(r.seconds_hf, ".1f"),
                 _fmt(r.ratio_ours_over_hf, ".3f"), _fmt(r.ratio_median_per_prompt, ".3f"), _fmt(r.speedup_ours), _fmt(r.speedup_hf), _fmt(r.same_text),
                 _fmt(r.equal_target_passes), f"{r.target_passes_ours} / {r.target_passes_hf}",
                 _fmt(r.overhead_pct_ours, ".1f")] for r in peers.itertuples()]
        parts.append(_md_table(["strategy", "prompts", "ours s", "hf s", "ours / hf", "median per prompt",
                                "speed-up ours", "speed-up hf",
                                "same text", "equal target passes", "target passes ours / hf", "overhead % (ours)"], rows))
        total = peers["seconds_ours"].sum() / peers["seconds_hf"].sum()
        parts += ["", f"Total seconds ours / transformers over all timed settings: **{total:.3f}** "
                      f"(speculative settings only: {_fmt(meta.get('ours_over_hf_speculative'), '.3f')}; goal ≤ 1.0). "
                      f"Speed-ups are against each implementation's own autoregressive run. Engine overhead (time outside the two models' forward passes) averages "
                      f"{_fmt(meta.get('overhead_pct_mean'), '.2f')} % of iteration time (goal < 5 %)."]
    if validation.get("checked"):
        parts += ["", "## Validation: replay against timed runs", "",
                  f"{validation['exact']} of {validation['checked']} timed runs have exactly the iterations and target "
                  f"passes replay predicted ({validation['exact_assistant']} also the assistant passes). Predicted "
                  f"time vs measured, summed per strategy: "
                  + ", ".join(f"`{k}` {v:+.1f} %" for k, v in validation["time_error_pct_by_strategy"].items())
                  + f"; total {validation['time_error_pct_total']:+.1f} % (tolerance ±{validation['tolerance_pct']:.0f} %, "
                  f"median absolute per-run error {validation['time_error_pct_rows_median_abs']:.1f} %). "
                  f"Outcome: counts **{'exact' if validation['counts_ok'] else 'NOT exact'}**, time "
                  f"**{'within' if validation['time_ok'] else 'OUTSIDE'}** tolerance.", ""]
        rows = [[r.prompt_id, f"`{r.strategy}`", f"{r.iterations_predicted} / {r.iterations_measured}",
                 f"{r.target_passes_predicted} / {r.target_passes_measured}",
                 f"{r.seconds_predicted:.2f} / {r.seconds_measured:.2f}", f"{r.time_error_pct:+.1f}",
                 _identical_cell(r)] for r in val.itertuples()]
        parts.append(_md_table(["prompt", "strategy", "iterations pred / meas", "target passes pred / meas",
                                "seconds pred / meas", "error %", "identical"], rows))
        if not validation["counts_ok"] and str(meta.get("dtype")) == "bf16":
            parts += ["", "In bf16, counts can differ while the text stays identical: the assistant's logits depend "
                      "on how it is fed (a live run feeds it on top of its own cache, replay's table computes each "
                      "chain from a prefix; an int8 assistant's dynamic activation scales also depend on the tokens "
                      "in each call), so a near-tied draft token can differ and an iteration accepts one token more "
                      "or less. The target decides the text, which is why it does not change. In fp32, replay "
                      "matches the engine exactly (tests/unit/test_replay.py)."]
    parts += ["", f"Wall time of this benchmark: {_fmt(meta.get('wall_seconds'), '.0f')} s.", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# the whole benchmark


@dataclass
class BenchConfig:
    models: str = "embedded"
    suite: str | None = None
    max_new_tokens: int = 64
    out: Path = Path("bench-out")
    mode: str = "both"
    dtype: str = "auto"
    device: str = "auto"
    assistant_precision: str = "auto"
    specs: tuple[str, ...] = ()
    timed_strategies: tuple[str, ...] = ()
    timed_prompts: int | None = 6
    prompts: str | None = None
    reps: int = 1
    calibration_reps: int = 2
    cache_dir: Path | None = None
    cost_profile: str = "measured"
    peer: bool = True
    progress: bool = True
    command: str = ""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(iterable, total: int, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)


def default_timed_strategies(best: dict) -> list[str]:
    specs = [AUTOREGRESSIVE, best.get("best_static") or "static:5", best.get("best_threshold"), REFERENCE_SETTING]
    return list(dict.fromkeys(s for s in specs if s))


def run_bench(cfg: BenchConfig, pair=None) -> dict:
    """Run the benchmark and write every output into ``cfg.out``. Returns paths and headline numbers."""
    from disco.models import load_pair

    wall = time.perf_counter()
    prompts = filter_prompts(load_suite(cfg.suite), cfg.prompts)
    specs = list(dict.fromkeys(cfg.specs or default_grid()))
    for s in specs + list(cfg.timed_strategies):
        parse_strategy(s)  # fail fast, before any model work
    if AUTOREGRESSIVE not in specs:
        specs.insert(0, AUTOREGRESSIVE)
    profile_name = cost_mod.check_profile(cfg.cost_profile)
    if profile_name != cost_mod.MEASURED and cfg.mode != "replay":
        raise BenchError(f"--cost-profile {profile_name} applies to --mode replay only (timed runs are measured "
                         "on this machine)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    if profile_name != cost_mod.MEASURED and pair is None:
        result = recost_cached(cfg, prompts, specs, profile_name)
        if result is not None:
            return result
    from disco.models import resolve_assistant

    pair = resolve_assistant(pair or load_pair(cfg.models, dtype=cfg.dtype, device=cfg.device),
                             cfg.assistant_precision, log=_log)
    meta = environment(pair)
    meta.update(command=cfg.command, suite=str(cfg.suite or DEFAULT_SUITE.name), max_new_tokens=cfg.max_new_tokens,
                mode=cfg.mode, grid_size=len(specs), time_tolerance_pct=100 * TIME_TOLERANCE)
    from disco.race import encode_prompt

    encoded = {p.id: encode_prompt(pair, p.prompt, p.chat, cfg.max_new_tokens) for p in prompts}
    runs: list[dict] = []
    summary = pd.DataFrame()
    costs = None
    tables = {}
    theory = None
    kmax = max([getattr(parse_strategy(s), "k", 1) for s in specs] + [1])

    if cfg.mode in ("replay", "both"):
        cache_dir = cfg.cache_dir or (cfg.out / "tables")
        t0 = time.perf_counter()
        for p in _progress(prompts, len(prompts), "replay tables", cfg.progress):
            tables[p.id], _ = prepare_table(pair, p, specs, cfg.max_new_tokens, cache_dir)
        meta["tables_seconds"] = time.perf_counter() - t0
        # costs are measured after the tables (models warm) and right before the timed runs, so that the
        # validation compares prediction and measurement taken under the same conditions
        t0 = time.perf_counter()
        if profile_name == cost_mod.MEASURED:
            _log(f"calibrating per-pass costs on {pair.describe()['models']} ({meta['dtype']}, {meta['device']}) ...")
            costs = cost_mod.suite_costs(pair, list(encoded.values()), kmax, reps=cfg.calibration_reps)
        else:
            costs = cost_mod.flat(0.0)  # placeholder, replaced below by the chosen profile
        meta["calibration_seconds"] = time.perf_counter() - t0
        meta["cost_profile"] = profile_name
        if profile_name != cost_mod.MEASURED:
            costs = cost_mod.resolve(profile_name, precision=meta.get("assistant_precision"),
                                     step_ms=costs.target_ms(1))
        meta["costs"] = costs.to_dict()
        for p in prompts:
            results = replay_many(tables[p.id], specs, cfg.max_new_tokens, costs)
            runs += replay_rows(p, tables[p.id], results, meta)
        meta["prompts_replayed"] = len(prompts)
        summary = summarize_runs(pd.DataFrame(runs))
        meta["best"] = best_settings(summary)
        hits = sum(t.meta.get("alpha_hits", 0) for t in tables.values())
        total = sum(t.meta.get("alpha_positions", 0) for t in tables.values())
        alpha = hits / total if total else math.nan
        meta["alpha"], meta["cost_ratio"] = alpha, costs.cost_ratio
        theory = theory_frame(alpha, costs.cost_ratio, costs, summary)

    if cfg.mode in ("timed", "both"):
        timed_specs = list(cfg.timed_strategies) or default_timed_strategies(meta.get("best", {}))
        if AUTOREGRESSIVE not in timed_specs:
            timed_specs.insert(0, AUTOREGRESSIVE)
        timed_prompts = pick_prompts(prompts, cfg.timed_prompts)
        meta["timed_strategies"] = timed_specs
        meta["prompts_timed"] = len(timed_prompts)
        warm_up(pair, encoded[timed_prompts[0].id])
        t0 = time.perf_counter()
        records = []
        for j, p in enumerate(_progress(timed_prompts, len(timed_prompts), "timed", cfg.progress)):
            ref = tables[p.id].reference_for(cfg.max_new_tokens) if p.id in tables else None
            rows, recs = timed_prompt(pair, p, timed_specs, cfg.max_new_tokens, meta, cfg.reps, ref, cfg.peer,
                                      order_offset=j)
            runs += rows
            records += recs
        meta["timed_seconds"] = time.perf_counter() - t0
        if records:
            frame = pd.DataFrame(records)
            frame["confidences"] = frame["confidences"].map(lambda cs: " ".join(f"{c:.4f}" for c in cs))
            frame.to_csv(cfg.out / "timed_iterations.csv", index=False)

    meta["wall_seconds"] = time.perf_counter() - wall
    return write_reports(cfg.out, pd.DataFrame(runs), meta, theory)


def _cached_table(cache_dir: Path, prompt: SuitePrompt, cfg: BenchConfig):
    """The one cached table of ``prompt`` that matches the run's models (and dtype / assistant precision when
    they are given), or None when there is none or several could match."""
    import re

    from disco.replay import ReplayTable, _safe

    pattern = re.compile(re.escape(_safe(prompt.id)) + r"-[0-9a-f]{16}\.json")
    found = []
    for path in sorted(Path(cache_dir).glob(f"{_safe(prompt.id)}-*.json")):
        if not pattern.fullmatch(path.name):
            continue
        try:
            table = ReplayTable.from_dict(json.loads(path.read_text()), path)
        except (OSError, ValueError, KeyError, TypeError, ReplayError):
            continue
        m = table.meta
        if m.get("models") != cfg.models or not table.covers(cfg.max_new_tokens):
            continue
        if cfg.dtype != "auto" and m.get("dtype") != cfg.dtype:
            continue
        if cfg.assistant_precision != "auto" and m.get("assistant_precision", "model") != cfg.assistant_precision:
            continue
        found.append(table)
    kinds = {(t.meta.get("dtype"), t.meta.get("assistant_precision", "model")) for t in found}
    if len(kinds) > 1:
        _log(f"{prompt.id}: cached tables for {sorted(kinds)}; give --dtype and --assistant-precision to pick one")
        return None
    return found[0] if found else None


def recost_cached(cfg: BenchConfig, prompts: list[SuitePrompt], specs: list[str], profile_name: str) -> dict | None:
    """Replay every spec from cached tables under a non-measured cost profile, without loading the models.

    Returns None (the caller then loads the models) when a prompt has no usable table or a table lacks a chain
    token some spec needs."""
    cache_dir = cfg.cache_dir or (cfg.out / "tables")
    tables = {p.id: _cached_table(cache_dir, p, cfg) for p in prompts}
    missing = [i for i, t in tables.items() if t is None]
    if missing:
        _log(f"no cached replay table for {', '.join(missing)} in {cache_dir}; loading the models")
        return None
    first = next(iter(tables.values())).meta
    meta = environment(None, {k: first.get(k) for k in ("models", "target", "assistant", "dtype", "device")})
    meta["assistant_precision"] = first.get("assistant_precision", "model")
    meta.update(command=cfg.command, suite=str(cfg.suite or DEFAULT_SUITE.name), max_new_tokens=cfg.max_new_tokens,
                mode="replay", grid_size=len(specs), cost_profile=profile_name, models_loaded=False)
    costs = cost_mod.resolve(profile_name, precision=meta["assistant_precision"])
    meta["costs"] = costs.to_dict()
    runs: list[dict] = []
    start = time.perf_counter()
    try:
        for p in prompts:
            runs += replay_rows(p, tables[p.id], replay_many(tables[p.id], specs, cfg.max_new_tokens, costs), meta)
    except ReplayError as exc:
        _log(f"the cached tables do not cover this grid ({exc}); loading the models")
        return None
    meta["prompts_replayed"] = len(prompts)
    hits = total = 0
    for t in tables.values():
        h, n = t.first_token_agreement(cfg.max_new_tokens)
        hits, total = hits + h, total + n
    meta["alpha"], meta["cost_ratio"] = (hits / total if total else math.nan), costs.cost_ratio
    meta["replay_seconds"] = meta["wall_seconds"] = time.perf_counter() - start
    _log(f"replayed {len(specs)} settings on {len(prompts)} cached tables under {profile_name} "
         f"in {meta['replay_seconds']:.1f} s (models not loaded)")
    return write_reports(cfg.out, pd.DataFrame(runs), meta)


def write_reports(out: Path, runs: pd.DataFrame, meta: dict, theory: pd.DataFrame | None = None) -> dict:
    """Every summary output from runs.csv's rows and the run's meta (also used by ``--report-only``)."""
    runs_df = add_decode_speedup(runs)
    summary = summarize_runs(runs_df)
    modes = set(runs_df["mode"]) if not runs_df.empty else set()
    val = validation_frame(runs_df) if {"replay", "timed"} <= modes else pd.DataFrame()
    validation = validation_outcome(val)
    peers = peer_frame(summary, runs_df) if "timed" in modes else pd.DataFrame()
    timed_ours = runs_df[(runs_df["mode"] == "timed") & (runs_df["implementation"] == "ours")] if modes else runs_df
    spec_rows = timed_ours[timed_ours["strategy"] != AUTOREGRESSIVE] if not timed_ours.empty else timed_ours
    meta["overhead_pct_mean"] = float(pd.to_numeric(spec_rows["overhead_pct"], errors="coerce").mean()) if not spec_rows.empty else math.nan
    meta["validation"] = validation
    meta["ours_over_hf_total"] = (float(peers["seconds_ours"].sum() / peers["seconds_hf"].sum())
                                  if not peers.empty else math.nan)
    spec_peers = peers[peers["strategy"] != AUTOREGRESSIVE] if not peers.empty else peers
    meta["ours_over_hf_speculative"] = (float(spec_peers["seconds_ours"].sum() / spec_peers["seconds_hf"].sum())
                                        if not spec_peers.empty else math.nan)
    if "replay" in modes:
        meta["best"] = best_settings(summary)
        if theory is None and meta.get("costs") and meta.get("alpha") is not None:
            costs = CostModel.from_dict(meta["costs"])
            theory = theory_frame(float(meta["alpha"]), costs.cost_ratio, costs, summary)

    out.mkdir(parents=True, exist_ok=True)
    runs_df.to_csv(out / "runs.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    if theory is not None:
        theory.to_csv(out / "theory.csv", index=False)
    if not val.empty:
        val.to_csv(out / "validation.csv", index=False)
    if not peers.empty:
        peers.to_csv(out / "peer.csv", index=False)
    files = {"runs": out / "runs.csv", "summary": out / "summary.csv", "summary_md": out / "summary.md",
             "meta": out / "meta.json"}
    if "replay" in modes and not summary.empty:
        fig = heatmap_figure(summary)
        fig.write_html(out / "heatmap.html", include_plotlyjs="cdn", full_html=True)
        (out / "heatmap.svg").write_text(heatmap_svg(summary), encoding="utf-8")
        files.update(heatmap_html=out / "heatmap.html", heatmap_svg=out / "heatmap.svg")
        try:  # PNG only where kaleido happens to be installed (it is not a dependency)
            import kaleido  # noqa: F401

            fig.write_image(out / "heatmap.png")
            files["heatmap_png"] = out / "heatmap.png"
        except Exception:  # noqa: BLE001 - any failure just means no PNG
            meta["heatmap_png"] = "skipped (kaleido not installed)"
    (out / "summary.md").write_text(summary_markdown(meta, summary, theory, validation, val, peers), encoding="utf-8")
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=_json_default), encoding="utf-8")
    return {"files": files, "meta": meta, "summary": summary, "runs": runs_df, "validation": validation, "peers": peers}


def report_only(out: Path) -> dict:
    """Rebuild the summaries from an earlier run's runs.csv and meta.json (no models needed)."""
    try:
        runs = pd.read_csv(out / "runs.csv")
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"--report-only needs runs.csv and meta.json in {out}: {exc}") from None
    return write_reports(out, runs, meta)


def _json_default(o):
    if isinstance(o, float) and o != o:
        return None
    if isinstance(o, Path):
        return str(o)
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)


# ---------------------------------------------------------------------------------------------
# the Sweep tab's engine (the UI only renders what this yields)


@dataclass
class SweepUpdate:
    done: int                 # prompts finished
    total: int
    runs: pd.DataFrame        # replay rows so far
    summary: pd.DataFrame
    message: str


def sweep(pair, prompts: list[SuitePrompt], specs: list[str], max_new_tokens: int, cache_dir: Path | None = None,
          on_progress: Callable[[float, str], None] | None = None,
          should_stop: Callable[[], bool] | None = None, cost_profile: str | None = None) -> Iterator[SweepUpdate]:
    """Replay ``specs`` on ``prompts``, one prompt at a time, yielding the growing results after each.

    ``cost_profile`` (``measured`` by default, ``flat:C`` or a CSV path, see disco.costs) only changes the time
    estimates; under a non-measured profile nothing is timed, so with cached tables the models are not run.

    ``on_progress(fraction, message)`` reports the work inside a prompt (for progress bars). ``should_stop`` is
    polled with every progress report (at most about every quarter second or decoded token): when it turns
    true the prompt in progress is dropped (its cached table is not saved) and the sweep ends; every update
    yielded before holds only completed prompts.
    """
    from disco.race import encode_prompt

    if not prompts:
        raise BenchError("pick at least one prompt")
    specs = list(dict.fromkeys([AUTOREGRESSIVE] + list(specs)))
    for s in specs:
        parse_strategy(s)
    encoded = [encode_prompt(pair, p.prompt, p.chat, max_new_tokens) for p in prompts]
    kmax = max([getattr(parse_strategy(s), "k", 1) for s in specs] + [1])
    meta = environment(pair)
    meta["max_new_tokens"] = max_new_tokens
    report = on_progress or (lambda fraction, message: None)
    costs = sweep_costs(pair, encoded, kmax, cache_dir, cost_profile, meta, report)
    runs: list[dict] = []
    n = len(prompts)
    for i, (p, ids) in enumerate(zip(prompts, encoded)):
        def at(fraction, what, i=i, p=p):
            if should_stop is not None and should_stop():
                raise Interrupted(p.id)
            report((i + fraction) / n, f"prompt {i + 1}/{n} ({p.id}): {what}")

        try:
            at(0.0, "target's greedy output")
            table = build_table(pair, ids, max_new_tokens, cache_dir, name=p.id,
                                progress=lambda done, total: at(0.5 * done / total, f"target's greedy output {done}/{total}"))
            replay_many(table, specs, max_new_tokens, progress=lambda f: at(0.5 + 0.5 * f, "assistant's chains"))
        except Interrupted:
            return
        if table.dirty:
            table.save()
        results = replay_many(table, specs, max_new_tokens, costs)
        runs += replay_rows(p, table, results, meta)
        frame = add_decode_speedup(pd.DataFrame(runs))
        yield SweepUpdate(i + 1, n, frame, summarize_runs(frame), f"{i + 1}/{n} prompts replayed")


def sweep_costs(pair, encoded: list[list[int]], kmax: int, cache_dir: Path | None, cost_profile: str | None,
                meta: dict | None = None, report: Callable[[float, str], None] | None = None) -> CostModel:
    """The cost model of a Sweep: ``measured`` (calibrated once per session and cached) or a hypothetical profile,
    expressed in this machine's target step when that is already known (it only scales the estimated seconds)."""
    name = cost_mod.check_profile(cost_profile)
    if meta is not None:
        meta["cost_profile"] = name
    if name == cost_mod.MEASURED:
        if report is not None:
            report(0.0, "measuring per-pass costs (once per session)")
        return cached_costs(pair, encoded, kmax, cache_dir)
    known = cost_mod.known_costs(pair, cache_dir)
    precision = (meta or {}).get("assistant_precision") or getattr(pair, "assistant_precision", None)
    return cost_mod.resolve(name, precision=precision, step_ms=known.target_ms(1) if known is not None else None)


def replay_iterations(pair, prompt: SuitePrompt, spec: str, max_new_tokens: int, cache_dir: Path | None = None,
                      cost_profile: str | None = None) -> pd.DataFrame:
    """The per-iteration trace replay predicts for one setting on one prompt (for the Sweep tab's detail view)."""
    from disco.race import encode_prompt

    ids = encode_prompt(pair, prompt.prompt, prompt.chat, max_new_tokens)
    table = build_table(pair, ids, max_new_tokens, cache_dir, name=prompt.id)
    parse_strategy(spec)
    costs = sweep_costs(pair, [ids], 20, cache_dir, cost_profile, environment(pair))
    results = replay_many(table, [spec], max_new_tokens, costs)
    if table.dirty:
        table.save()
    return results[spec].frame()


# ---------------------------------------------------------------------------------------------
# command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise BenchError(f"{message} (see {self.prog} --help)")


def _int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _list(text: str, cast) -> list:
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m disco bench",
                description="Static vs dynamic speculation lookahead on a prompt suite: exact greedy replay of a grid, "
                            "timed runs of the best settings, and transformers' assisted generation as the peer.")
    p.add_argument("--models", default=os.environ.get("DISCO_MODELS", "embedded"),
                   help="tiny, embedded (default), or TARGET::ASSISTANT")
    p.add_argument("--suite", default=None, help=f"prompt suite (.json/.jsonl; default {DEFAULT_SUITE.name})")
    p.add_argument("--prompts", default=None, help="comma-separated prompt ids or kinds to keep")
    p.add_argument("--max-new-tokens", type=_int_arg, default=None, help="tokens per prompt (default 64; quick 32)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default bench-out/MODELS)")
    p.add_argument("--quick", action="store_true",
                   help="CI smoke run: tiny pair, 3 prompts, both modes including the peer")
    p.add_argument("--mode", choices=["replay", "timed", "both"], default=None,
                   help="replay (default; exact greedy replay of the grid), timed (real runs + transformers peer), "
                        "or both (adds the validation of replay against the timed runs; the --quick default)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: chosen by timing the passes that matter on this machine (cached)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--assistant-precision", choices=["auto", "model", "int8"],
                   default=os.environ.get("DISCO_ASSISTANT_PRECISION", "auto"),
                   help="the assistant's weights for every lane: model, int8 (dynamic int8, CPU) or auto (calibrated)")
    p.add_argument("--static-ks", type=lambda t: _list(t, int), default=None, help=f"default {','.join(map(str, STATIC_KS))}")
    p.add_argument("--taus", type=lambda t: _list(t, float), default=None, help="default 0.05,0.1,...,0.95")
    p.add_argument("--kmaxes", type=lambda t: _list(t, int), default=None, help=f"default {','.join(map(str, KMAXES))}")
    p.add_argument("--strategy", action="append", dest="extra", default=[], metavar="SPEC",
                   help="extra strategy to replay (repeatable)")
    p.add_argument("--timed-strategies", default=None,
                   help="comma-separated specs to time (default: autoregressive, best static K, best threshold, "
                        "threshold:0.4:20)")
    p.add_argument("--timed-prompts", type=_int_arg, default=None,
                   help="how many prompts to time, spread over the kinds (default 6; quick: all)")
    p.add_argument("--reps", type=_int_arg, default=1, help="A B repetitions per prompt and strategy (median kept)")
    p.add_argument("--calibration-reps", type=_int_arg, default=2, help="timings per pass size (median kept)")
    p.add_argument("--cache-dir", type=Path, default=None, help="replay tables cache (default OUT/tables)")
    p.add_argument("--cost-profile", default="measured", metavar="PROFILE",
                   help="how replay turns passes into time: measured (this machine, default), flat:C (every target pass "
                        "one step, an assistant pass C steps: a GPU with a tiny draft), or a per-pass CSV from "
                        "`python -m disco profile --csv`. Other than measured: --mode replay only, and cached tables "
                        "are re-costed in seconds without loading the models")
    p.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    p.add_argument("--threads", type=_int_arg, default=None, help="torch intra-op threads")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild summary.csv/md, heatmaps, theory, validation from OUT/runs.csv and meta.json")
    return p


def config_from_args(args, argv: list[str]) -> BenchConfig:
    quick = args.quick
    models = "tiny" if quick and "--models" not in " ".join(argv) else args.models
    specs = default_grid(args.static_ks or STATIC_KS, args.taus or TAUS, args.kmaxes or KMAXES)
    specs += list(args.extra)
    for tau in args.taus or ():
        if not 0 <= tau <= 1:
            raise BenchError(f"--taus: {tau} is not in [0, 1]")
    timed = tuple(s.strip() for s in args.timed_strategies.split(",") if s.strip()) if args.timed_strategies else ()
    out = args.out or Path("bench-out") / ("quick" if quick else "".join(c if c.isalnum() else "_" for c in models)[:40])
    prompts = args.prompts
    if quick and prompts is None:
        suite = load_suite(args.suite)
        prompts = ",".join(p.id for p in pick_prompts(suite, 3))
    return BenchConfig(
        models=models, suite=args.suite, max_new_tokens=args.max_new_tokens or (32 if quick else 64), out=out,
        mode=args.mode or ("both" if quick else "replay"), dtype=args.dtype, device=args.device,
        assistant_precision=args.assistant_precision, specs=tuple(specs), timed_strategies=timed,
        timed_prompts=args.timed_prompts or (None if quick else 6), prompts=prompts, reps=args.reps,
        calibration_reps=args.calibration_reps,
        cache_dir=args.cache_dir, cost_profile=args.cost_profile, peer=not args.no_peer, progress=not args.no_progress,
        command="python -m disco bench " + " ".join(argv),
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from disco.engine import InputError
    from disco.models import ModelLoadError
    from disco.precision import PrecisionError

    try:
        args = build_parser().parse_args(argv)
        cfg = config_from_args(args, argv)
        if args.report_only:
            result = report_only(cfg.out)
            print(f"rewrote the reports in {cfg.out}/")
            return 0
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        elif cfg.models == "tiny":
            torch.set_num_threads(1)  # tiny models gain nothing from threads; on a busy machine they thrash
        result = run_bench(cfg)
    except (BenchError, InputError, StrategyError, ModelLoadError, ReplayError, PrecisionError,
            cost_mod.CostProfileError) as exc:
        print(f"disco bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"disco bench: error: {exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("disco bench: error: interrupted (replay tables computed so far are cached; re-run to resume)", file=sys.stderr)
        return 130
    meta = result["meta"]
    best = meta.get("best", {})
    lines = [f"wrote {cfg.out}/: " + ", ".join(sorted(p.name for p in result["files"].values()))]
    if best:
        lines.append(f"best static {best.get('best_static')} {best.get('best_static_speedup', math.nan):.2f}x | "
                     f"{REFERENCE_SETTING} {best.get('reference_speedup', math.nan):.2f}x | best threshold "
                     f"{best.get('best_threshold')} {best.get('best_threshold_speedup', math.nan):.2f}x | oracle "
                     f"{best.get('best_oracle_speedup', math.nan):.2f}x (replay, geomean)")
    v = result["validation"]
    if v.get("checked"):
        lines.append(f"validation: {v['exact']}/{v['checked']} runs with exactly the predicted iterations and target "
                     f"passes; time error {v['time_error_pct_total']:+.1f}% total, per strategy within "
                     f"±{v['tolerance_pct']:.0f}%: {'yes' if v['time_ok'] else 'no'}")
    if meta.get("ours_over_hf_total") == meta.get("ours_over_hf_total"):
        lines.append(f"ours / transformers seconds: {meta['ours_over_hf_total']:.3f}; "
                     f"engine overhead {meta.get('overhead_pct_mean', math.nan):.2f}%")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
