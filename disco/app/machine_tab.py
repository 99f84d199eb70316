"""The "This machine" tab's text: the numerics decision, the costs that decide whether speculation pays, and the
recommended setting. Pure: plain dicts in (``Profile.to_dict()``, ``Calibration.to_dict()``), markdown out."""

from __future__ import annotations

import html
import math

from disco.bench.kernel_price import markdown as kernel_markdown
from disco.models import cpu_variant
from disco.policies.export import take_away_md
from disco.text import times as _x


def _ms(value) -> str:
    return "—" if value is None or value != value else f"{float(value):.0f}"


def engines_md(decision: dict | None, measured: list[str], offered: list[str]) -> str:
    """Both engines side by side and the measured choice (``disco.costs.engines.decide``), or how to get it."""
    if decision is None:
        missing = [e for e in offered if e not in measured]
        if not missing:
            return ""
        names = " and ".join(f"`{e}`" for e in missing)
        return (f"**Engines:** only {', '.join(measured) or 'none'} measured here. `python -m disco profile --engine "
                f"{missing[0]}` measures {names} (for the embedded pair on torch the first time converts it to bf16: "
                "about 2.5 minutes and 8.6 GiB); the `auto` engine then follows the faster one.")
    run = decision["for_run"]
    rows = ["| engine | target step (ms) | best lane | its speed-up | decode (ms a token) | prefill (ms a prompt "
            f"token) | a {run['prompt_tokens']} + {run['new_tokens']}-token run (s) |", "|---|---|---|---|---|---|---|"]
    for e, f in decision["engines"].items():
        mark = " ◀" if e == decision["engine"] else ""
        rows.append(f"| {e}{mark} | {_ms(f['step_ms'])} | `{f['lane']}` | {_x(f['lane_speedup'])} | "
                    f"{f['decode_ms_per_token']:.0f} | {f['prefill_ms_per_token']:.1f} | {f['run_ms'] / 1000:.2f} |")
    return (f"**Engines measured on this machine** (the `auto` engine runs the faster): {decision['reason']}"
            + "\n\n" + "\n".join(rows))


def kernels_md(kernels: dict | None, note: str | None = None) -> str:
    """llama.cpp's exact kernels priced against its defaults and the memory floor (``disco.bench.kernel_price``)."""
    if kernels is not None:
        return kernel_markdown(kernels)
    return f"**What exact kernels cost here:** not measured: {html.escape(note)}." if note else ""


def markdown(profile: dict | None, calibration: dict | None, step: str | None, error: str | None,
             pair: dict | None, engines: str = "", kernels: str = "") -> str:
    parts = []
    if profile is not None:
        parts.append(f"**Machine:** {html.escape(profile['machine'])}, torch {profile['key']['torch']}")
    if pair is not None and pair.get("cpu_variant"):
        how = ("named by `DISCO_LLAMA_CPU_VARIANT`" if cpu_variant.wanted() else
               "the best of those built that this CPU runs (AMX only when named; `DISCO_LLAMA_CPU_VARIANT` names another)")
        parts.append(f"**llama.cpp's kernels:** its `{html.escape(pair['cpu_variant'])}` CPU variant, {how}.")
    if calibration is not None:
        parts.append(f"**Numerics (chosen by timing the passes that matter):** {calibration['dtype']} with the "
                     f"{calibration['assistant_precision']} assistant by default: {html.escape(calibration['reason'])}.")
        rows = ["| dtype | target 1 / 4 / 8 tokens (ms) | assistant step (ms) | predicted ms/token (best K) |",
                "|---|---|---|---|"]
        for d, t in calibration["target_ms"].items():
            pred = calibration["predicted"].get(d, {})
            best = f" (K={pred['k']}, {pred.get('assistant')})" if pred.get("k") is not None else ""
            rows.append(f"| {d} | {_ms(t.get('1'))} / {_ms(t.get('4'))} / {_ms(t.get('8'))} | "
                        f"{_ms(calibration['assistant_ms'].get(d))} | {_ms(pred.get('ms_per_token'))}{best} |")
        if "int8" in calibration["assistant_ms"]:
            rows.append(f"| int8 assistant | | {calibration['assistant_ms']['int8']:.0f} | |")
        parts.append("\n".join(rows))
    elif pair is not None:
        parts.append(f"**Numerics:** {pair['dtype']} on {pair['device']} (set explicitly, or not a CPU calibration), "
                     f"assistant {pair['assistant_precision']}.")
    if profile is None:
        if error:
            parts.append(f"The cost profile is not available: {html.escape(error)}.")
        else:
            parts.append(f"○ Measuring this machine's cost profile in the background ({html.escape(step or '')}). "
                         "Runs take turns with it, so a Run may wait a second or two. It is measured once and cached.")
        return "\n\n".join(parts)
    if profile.get("preliminary"):
        parts.append(f"○ **A quick first look** (fewer pass sizes, one timing each, one prompt); the full profile is "
                     f"being measured in the background ({html.escape(step or 'queued')}) and replaces it.")
    t = {int(n): v for n, v in profile["target_ms"].items()}
    verify = ", ".join(f"{n - 1} drafts {t[n] / t[1]:.2f}×" for n in (5, 9, 17, 21, 33) if n in t)
    parts.append(f"**Verification:** a target pass over 1 token costs {t[1]:.0f} ms; verifying {verify} that. "
                 "Speculation pays only while verifying K drafts costs about one target step (flat) and a draft step "
                 "is cheap (small c).")
    rows = ["| assistant | step (ms) | c | acceptance α | best static K | best threshold | τ=0.4, KMAX=20 | "
            "Leviathan, measured verify |", "|---|---|---|---|---|---|---|---|"]
    for p, e in profile["recommended"].get("by_precision", {}).items():
        rows.append(f"| {p} | {float(profile['assistant_ms'][p]['1']):.0f} | {profile['cost_ratio'][p]:.2f} | "
                    f"{profile['acceptance'].get(p, math.nan):.2f} | `{e.get('static')}` {_x(e.get('static_speedup'))} | "
                    f"`{e.get('threshold')}` {_x(e.get('threshold_speedup'))} | {_x(e.get('reference_speedup'))} | "
                    f"K={e.get('leviathan_k')} {_x(e.get('leviathan_speedup'))} |")
    parts.append("\n".join(rows))
    rec = profile["recommended"]
    verdict = "speculation pays here" if rec.get("speculation_pays") else "speculation does **not** pay here"
    parts.append(f"**Recommended (the `auto` lane):** `{rec.get('auto')}`, {_x(rec.get('auto_speedup'))} over "
                 f"autoregressive by exact replay of {', '.join(profile['prompts'])} ({profile['max_new_tokens']} "
                 f"tokens each, geomean; {verdict}). Measured {profile['measured_at']} in {profile['seconds']:.0f} s; "
                 "`python -m disco profile --refresh` measures again.")
    if not rec.get("speculation_pays") and rec.get("best_speculative"):
        parts.append(f"The best speculative setting, `{rec['best_speculative']}`, reaches "
                     f"{_x(rec.get('best_speculative_speedup'))}: on this machine verifying each extra token costs "
                     "almost as much as a target step (see the chart), so the `auto` lane runs the target alone.")
    if engines:
        parts.append(engines)
    if kernels:
        parts.append(kernels)
    if step and not profile.get("preliminary"):  # the background is still at work: comparing the engines
        parts.append(f"○ {html.escape(step)}")
    for settings in profile.get("take_away") or ():
        parts.append(take_away_md(settings))
    return "\n\n".join(parts)
