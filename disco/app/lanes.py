"""The Race tab's lanes: each lane's card (its policy, live numbers, the text with tokens coloured by origin) and
the summary table, read only from the trace (``disco.decode.race.Snapshot``)."""

from __future__ import annotations

import html
import re
from typing import Callable

import pandas as pd

from disco.app import plots
from disco.decode import divergence
from disco.decode.trace import SOURCE_AUTOREGRESSIVE, SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT
from disco.policies import AUTOREGRESSIVE, Policy
from disco.text import fmt, missing, times


SOURCE_LABELS = {
    SOURCE_DRAFT: "accepted draft",
    SOURCE_CORRECTION: "target correction",
    SOURCE_BONUS: "target bonus",
    SOURCE_AUTOREGRESSIVE: "target (autoregressive)",
}

LANES_CSS = """
.disco-lanes { display: grid; gap: 12px; grid-template-columns: repeat(var(--n, 3), minmax(0, 1fr)); }
.disco-lane { border: 1px solid #e5e7eb; border-top: 4px solid var(--lane); border-radius: 10px; padding: 10px 12px;
  background: var(--block-background-fill, #fff); min-width: 0; }
.disco-lane-head { display: flex; align-items: baseline; gap: 8px; flex-wrap: wrap; }
.disco-lane-name { font-weight: 700; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; color: var(--lane); }
.disco-lane-help { color: #6b7280; font-size: 12px; flex: 1; }
.disco-lane-state { font-size: 11px; padding: 1px 8px; border-radius: 999px; background: #f3f4f6; color: #374151; }
.disco-lane-state.done { background: #dcfce7; color: #166534; }
.disco-stats { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 6px; margin: 8px 0; }
.disco-stat { background: #f9fafb; border-radius: 8px; padding: 4px 8px; }
.disco-stat b { display: block; font-size: 18px; font-variant-numeric: tabular-nums; color: #111827; }
.disco-stat span { font-size: 11px; color: #6b7280; }
.disco-text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: 13px; line-height: 1.6; max-height: 360px; overflow-y: auto; padding: 8px; border-radius: 8px;
  background: #fcfcfd; border: 1px solid #f1f5f9; color: #111827; }
.disco-text .t-accepted_draft { background: #d1fae5; }
.disco-text .t-target_correction { background: #fecaca; }
.disco-text .t-target_bonus { background: #bfdbfe; }
.disco-text .t-autoregressive { background: transparent; }
.disco-text .t-special { color: #9ca3af; font-style: italic; }
.disco-text .t-diverge { outline: 2px solid #7c3aed; outline-offset: 1px; border-radius: 2px; }
.disco-empty { color: #9ca3af; font-style: italic; }
.disco-legend { display: flex; gap: 14px; flex-wrap: wrap; font-size: 12px; color: #4b5563; margin-top: 8px; }
.disco-legend i { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin-right: 4px;
  vertical-align: -2px; border: 1px solid #d1d5db; }
@media (max-width: 900px) { .disco-lanes { grid-template-columns: 1fr; } }
"""

LEGEND_HTML = (
    '<div class="disco-legend">'
    '<span><i style="background:#d1fae5"></i>accepted draft (assistant guessed, target agreed)</span>'
    '<span><i style="background:#fecaca"></i>target correction (first rejected draft replaced)</span>'
    '<span><i style="background:#bfdbfe"></i>target bonus (all drafts accepted, one extra token)</span>'
    '<span><i style="background:#ffffff"></i>autoregressive (one target pass per token)</span>'
    '<span>· hover a token for its iteration and draft probability</span>'
    "</div>"
)


def _token_spans(tokens: pd.DataFrame, decode: Callable[[list[int]], str] | None, divergence: dict | None = None) -> str:
    """Coloured, escaped token spans with a tooltip each. Byte-level BPE splits some characters (emoji,
    CJK) over several tokens that each decode to U+FFFD; with ``decode`` such a run (up to 4 tokens) is
    decoded together and shown as one span, coloured by its last token."""
    rows = list(tokens.itertuples(index=False))
    parts, i = [], 0
    while i < len(rows):
        group, text = rows[i:i + 1], str(rows[i].text)
        if decode is not None and "\ufffd" in text:
            for n in range(2, min(4, len(rows) - i) + 1):
                joined = decode([int(r.token_id) for r in rows[i:i + n]])
                if "\ufffd" not in joined:
                    group, text = rows[i:i + n], joined
                    break
        i += len(group)
        last = group[-1]
        prob = "" if missing(last.draft_prob) else f" · draft p = {last.draft_prob:.3f}"
        title = f"iteration {last.iteration} · {SOURCE_LABELS.get(last.source, last.source)}{prob}"
        cls = f"t-{last.source}" + (" t-special" if _is_special(text) else "")
        if divergence is not None and any(int(r.position) == divergence["position"] for r in group):
            cls += " t-diverge"  # where this lane's text leaves the baseline's
            title += f" · {divergence['kind']}: the baseline wrote {divergence['baseline_text']!r} here"
        parts.append(f'<span class="{cls}" title="{html.escape(title)}">{html.escape(text)}</span>')
    return "".join(parts)


def _is_special(text: str) -> bool:
    return bool(re.fullmatch(r"<\|?[A-Za-z_]+\|?>", text))


def lane_numbers(summary: dict, base: dict | None) -> dict:
    """The live figures of one lane. The speed-up is final once the lane and the baseline are both done;
    before that it is estimated from the two lanes' token rates so far (shown with ≈)."""
    baseline = summary["strategy"] == AUTOREGRESSIVE
    speedup, approx = summary.get("speedup"), ""
    if baseline:
        speedup = 1.0
    elif missing(speedup) and base is not None and (base.get("tokens_per_s") or 0) > 0:
        speedup, approx = (summary.get("tokens_per_s") or 0.0) / base["tokens_per_s"], "≈"
    rate = summary.get("acceptance_rate")
    quiet = " quiet" if summary.get("quiet") else ""  # figures from this machine's quiet pass costs (a busy race)
    return {
        "new tokens": fmt(summary.get("new_tokens"), "d"),
        "tokens/s": fmt(summary.get("tokens_per_s"), ".1f") + quiet,
        "speed-up": "—" if missing(speedup) or not speedup else f"{approx}{speedup:.2f}×{quiet}",
        "acceptance": "—" if missing(rate) else f"{100 * rate:.0f} %",
        "mean lookahead": "0" if baseline else fmt(summary.get("mean_lookahead"), ".1f"),
        "target passes": fmt(summary.get("target_calls"), "d"),
    }


def lanes_html(lanes: list[Policy], tokens: pd.DataFrame | None, summaries: list[dict] | None,
               decode: Callable[[list[int]], str] | None = None, message: str | None = None) -> str:
    """The lanes side by side: header, live numbers, and the text with tokens coloured by origin."""
    summaries = summaries or []
    by_strategy = {s["strategy"]: s for s in summaries}
    base = by_strategy.get(AUTOREGRESSIVE)
    cards = []
    for lane in lanes:
        spec = lane.spec
        color = plots.strategy_color(spec)
        summary = by_strategy.get(spec)
        if summary is not None:
            numbers = lane_numbers(summary, base)
            done = bool(summary.get("done"))
            state = "done" if done else "running"
            state_text = f"done · {summary.get('finish_reason')}" if done and summary.get("finish_reason") else state
        else:
            numbers = dict.fromkeys(("new tokens", "tokens/s", "speed-up", "acceptance", "mean lookahead",
                                     "target passes"), "—")
            state, state_text = "", "waiting"
        stats = "".join(f'<div class="disco-stat"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>'
                        for k, v in numbers.items())
        lane_tokens = tokens[tokens["strategy"] == spec] if tokens is not None and not tokens.empty else None
        if lane_tokens is not None and not lane_tokens.empty:
            body = _token_spans(lane_tokens, decode, (summary or {}).get("divergence"))
        else:
            body = f'<span class="disco-empty">{html.escape(message or "no tokens yet")}</span>'
        cards.append(
            f'<div class="disco-lane" style="--lane:{color}" data-strategy="{html.escape(spec)}">'
            f'<div class="disco-lane-head"><span class="disco-lane-name">{html.escape(spec)}</span>'
            f'<span class="disco-lane-help">{html.escape(lane.describe())}</span>'
            f'<span class="disco-lane-state {state}">{html.escape(state_text)}</span></div>'
            f'<div class="disco-stats">{stats}</div>'
            f'<div class="disco-text">{body}</div></div>'
        )
    return f'<div class="disco-lanes" style="--n:{max(1, len(lanes))}">{"".join(cards)}</div>{LEGEND_HTML}'


SUMMARY_COLUMNS = ["lane", "assistant", "new tokens", "time (s)", "tokens/s", "speed-up", "acceptance", "mean lookahead",
                   "target passes", "draft passes", "TTFT (ms)", "same as baseline", "quiet-cost time (s)",
                   "quiet-cost speed-up"]


def summary_frame(summaries: list[dict] | None, quiet=None) -> pd.DataFrame:
    """The summary table; ``quiet`` (``disco.app.quiet.QuietCheck``) adds what each lane's iterations cost on this
    machine when quiet, and the speed-up from those costs."""
    rows = []
    for s in summaries or []:
        same = s.get("identical_to_autoregressive")
        rows.append([
            s["strategy"], s.get("assistant_precision") or "—", int(s["new_tokens"]), fmt(s.get("seconds"), ".2f"), fmt(s.get("tokens_per_s"), ".1f"),
            times(s.get("speedup")),
            fmt(100 * s["acceptance_rate"] if not missing(s.get("acceptance_rate")) else None, ".1f", suffix=" %"),
            fmt(s.get("mean_lookahead"), ".2f"),
            int(s["target_calls"]), int(s["draft_calls"]), fmt(s.get("ttft_ms"), ".0f"),
            "—" if same is None else ("yes" if same else "no: " + (divergence.short(s.get("divergence")) or "differs")),
            fmt(quiet.quiet_s.get(s["strategy"]) if quiet else None, ".2f"),
            times(quiet.speedup(s["strategy"], "autoregressive") if quiet else None),
        ])
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
