"""The app's Sweep tab: replay a grid of lookahead settings on a suite's prompts and watch the heatmap fill in.

``build_sweep_tab(get_pair)`` is called by app.py inside an open ``gr.Tab``. All the work is done by
``disco.bench.sweep.sweep`` (exact greedy replay, see ``disco.replay``); this file only lays out and wires widgets.
The suite (the built-in one, HumanEval, or an uploaded benchmark file) and its prompts are chosen by
``disco.app.sweep_suites``; the grid's text fields become ``Policy`` objects once (``grid_policies``); tables live in
the one cache, so prompts the background profile or an earlier sweep replayed cost no model work. The answer is shown
overall and per kind of prompt (``disco.bench.kinds``), with a heatmap for each kind. A heatmap cell is chosen with
the "Setting" dropdown (Gradio 6's ``gr.Plot`` has no click event).
"""

from __future__ import annotations

import time
import logging
import math
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from disco import limits
from disco.app import plots, zerogpu
from disco.app.session import COMPUTE_LOCK, STOP_LABEL, StopSignals
from disco.bench.analysis import REFERENCE_SETTING, best_settings
from disco.bench.heatmap import heatmap_figure
from disco.app import sweep_batch, sweep_suites
from disco.app.sweep_controls import (  # noqa: F401  (the tab's names, declared with its controls)
    DEFAULT_KMAXES, DEFAULT_STATIC, DEFAULT_TAUS, MAX_SWEEP_TOKENS, SWEEP_CONTROLS, SweepRequest, default_rules,
)
from disco.app.sweep_views import (
    DETAIL_COLUMNS, RULE_CHOICES, SUMMARY_COLUMNS, csv_path, detail_view, fit_words, kinds_table, status_line,
    top_settings,
)
from disco.bench.kinds import ALL, kind_slice
from disco.bench.sweep import replay_iterations, sweep
from disco.errors import BenchError
from disco.costs import model as cost_mod
from disco.errors import UserError, first_line
from disco.policies import Policy, parse_strategy, policy_class
from disco.policies.grids import default_grid

log = logging.getLogger("disco.app")
CSV_EVERY_S = 10.0
MAX_FIELD_CHARS = 2000  # a grid field; the settings limit (limits.Budgets) is checked once the grid is built


def _numbers(text: str, cast, what: str, lo: float, hi: float) -> list:
    if len(str(text or "")) > MAX_FIELD_CHARS:
        raise BenchError(f"{what}: the list is too long ({len(str(text)):,} characters; at most {MAX_FIELD_CHARS})")
    try:
        values = [cast(x) for x in str(text or "").replace(" ", ",").split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"{what}: expected comma-separated numbers, got {text!r}") from None
    for v in values:
        if not lo <= v <= hi:
            raise BenchError(f"{what}: {v} is outside [{lo:g}, {hi:g}]")
    return values


def grid_policies(static_ks: str, taus: str, kmaxes: str, heuristic: bool, oracle: bool, max_lookahead: int = 64,
                  rules=()) -> list[Policy]:
    """The sweep's grid: the classic kinds from the text fields, then each ticked stopping rule over its own
    parameters' grid (``disco.policies`` metadata) with the KMAX values given."""
    ks = _numbers(static_ks, int, "static K", 1, max_lookahead)
    ts = _numbers(taus, float, "τ", 0, 1)
    ms = _numbers(kmaxes, int, "KMAX", 1, max_lookahead)
    if not ts or not ms:
        raise BenchError("give at least one τ and one KMAX")
    if isinstance(rules, str):
        rules = [rules]
    rules = list(dict.fromkeys(rules or ()))
    known = set(RULE_CHOICES)
    for kind in rules:
        if kind not in known:
            raise BenchError(f"unknown stopping rule {str(kind)[:40]!r}: choose from {', '.join(RULE_CHOICES)}")
        reason = policy_class(kind).unavailable()
        if reason:
            raise BenchError(reason)
    return default_grid(ks, ts, ms, heuristic=(5,) if heuristic else (), oracle=oracle, kinds=rules)


def profile_choice(menu: str | None, upload: str | None) -> str:
    """The Sweep's cost profile: an uploaded CSV wins over the menu. The menu takes ``measured`` or ``flat:C``
    only (a typed path would let a caller read files on the server)."""
    if upload:
        return cost_mod.check_profile(str(upload))
    text = str(menu or "").strip()
    if text and text != cost_mod.MEASURED and not text.startswith("flat:"):  # checked before any file is looked at
        if text.lower().endswith(".csv"):
            raise BenchError(f"cost profile {menu!r}: choose measured or flat:C here; upload a CSV for per-pass costs")
        return cost_mod.check_profile(text)  # raises: unknown cost profile ...
    return cost_mod.check_profile(text)


@dataclass
class _Widgets:
    controls: dict  # the Run event's inputs by control name (SWEEP_CONTROLS)
    run: gr.Button
    stop: gr.Button
    status: gr.Markdown
    heatmap_kind: gr.Dropdown
    heatmap: gr.Plot
    table: gr.Dataframe
    kinds: gr.Dataframe
    setting: gr.Dropdown
    detail_prompt: gr.Dropdown
    detail_plot: gr.Plot
    detail_table: gr.Dataframe
    csv_file: gr.File
    state: gr.State

    def __getattr__(self, name: str):  # w.suite_menu, w.profile_csv ...: the control of that name
        controls = self.__dict__.get("controls") or {}
        if name in controls:
            return controls[name]
        raise AttributeError(name)

    def run_inputs(self) -> list:
        return SWEEP_CONTROLS.inputs(self.controls)

    def outputs(self) -> list:
        return [self.status, self.heatmap, self.table, self.setting, self.detail_prompt, self.csv_file, self.state,
                self.kinds, self.heatmap_kind]


def _layout(suite) -> _Widgets:
    """The tab's widgets, top to bottom."""
    gr.Markdown(
        "Replay a grid of lookahead settings on a suite's prompts: the built-in suite, HumanEval, or a benchmark file "
        "you upload (a Spec-Bench or MT-Bench `question.jsonl`, a HumanEval-format file, any JSONL or CSV with a "
        "`prompt` column). Greedy decoding makes this exact: the target's output and the assistant's drafts along it "
        "are computed once per prompt (cached), then every setting is replayed without the models, its time estimated "
        "from per-pass costs measured here. The first run on a prompt takes about as long as decoding it twice; "
        "re-runs are instant. The answer is given overall and per kind of prompt.")
    c = {}  # the widgets by control name: SWEEP_CONTROLS makes each
    with gr.Row():
        with gr.Column(scale=3):
            with gr.Row():
                c["suite_menu"], c["suite_file"] = SWEEP_CONTROLS["suite_menu"].make(), SWEEP_CONTROLS["suite_file"].make()
            c["prompt_ids"] = SWEEP_CONTROLS["prompt_ids"].make(choices=sweep_suites.choices(suite),
                                                                value=sweep_suites.default_ticks(suite))
            with gr.Row():
                c["sample_n"], c["sample_seed"] = SWEEP_CONTROLS["sample_n"].make(), SWEEP_CONTROLS["sample_seed"].make()
        with gr.Column(scale=2):
            for name in ("static_text", "tau_text", "kmax_text"):
                c[name] = SWEEP_CONTROLS[name].make()
            with gr.Row():
                c["use_heuristic"], c["use_oracle"] = (SWEEP_CONTROLS["use_heuristic"].make(),
                                                       SWEEP_CONTROLS["use_oracle"].make())
            c["rule_choice"] = SWEEP_CONTROLS["rule_choice"].make(value=default_rules())
            c["max_new"] = SWEEP_CONTROLS["max_new"].make()
            with gr.Row():
                c["profile_menu"], c["profile_csv"] = (SWEEP_CONTROLS["profile_menu"].make(),
                                                       SWEEP_CONTROLS["profile_csv"].make())
            with gr.Row():
                run = gr.Button("▶ Run sweep", variant="primary", elem_id="sweep-run")
                stop = gr.Button(STOP_LABEL, variant="stop", elem_id="sweep-stop")
    status = gr.Markdown("Pick prompts and a grid, then press **Run sweep**.", elem_id="sweep-status", min_height=48)
    heatmap_kind = gr.Dropdown([ALL], value=ALL, label="Heatmap of (all prompts, or one kind)", elem_id="sweep-heatmap-kind",
                               interactive=True)
    heatmap = gr.Plot(plots.empty_figure("Speed-up over τ × KMAX", "press Run sweep"), show_label=False,
                      elem_id="sweep-heatmap")
    table = gr.Dataframe(pd.DataFrame(columns=SUMMARY_COLUMNS), label="Best settings (geometric-mean speed-up)",
                         interactive=False, elem_id="sweep-summary")
    kinds = gr.Dataframe(kinds_table(None), label=f"Per kind of prompt: {REFERENCE_SETTING} against each kind's best "
                                                  "(in hindsight), the best dynamic rule against the best static K",
                         interactive=False, elem_id="sweep-kinds")
    with gr.Row():
        setting = gr.Dropdown([], label="Setting (a heatmap cell, or any replayed strategy)", elem_id="sweep-setting",
                              interactive=True)
        detail_prompt = gr.Dropdown([], label="Prompt", elem_id="sweep-detail-prompt", interactive=True)
    detail_plot = gr.Plot(plots.empty_figure(plots.LOOKAHEAD_TITLE, "run a sweep, then pick a setting"),
                          show_label=False, elem_id="sweep-detail-plot")
    detail_table = gr.Dataframe(pd.DataFrame(columns=DETAIL_COLUMNS), label="Per iteration (replayed)",
                                interactive=False, elem_id="sweep-detail")
    csv_file = gr.File(label="Download CSV: one row per prompt × setting", elem_id="sweep-csv")
    return _Widgets(c, run, stop, status, heatmap_kind, heatmap, table, kinds, setting, detail_prompt, detail_plot,
                    detail_table, csv_file, gr.State({}))


def _skip_all(n: int = 9):
    return tuple(gr.skip() for _ in range(n))


def _write_csv(runs) -> str:
    """The sweep's rows so far as a new CSV for the download (``csv_path`` keeps the newest few)."""
    path = str(csv_path())
    runs.to_csv(path, index=False)
    return path


def _stream(get_pair, records, grid, max_new, profile, should_stop, deadline, progress, start):
    """The sweep's updates as the tab's outputs (``_Widgets.outputs``), prompt by prompt, then how it ended."""
    yield ("Loading the models ...", *_skip_all(8))
    pair = get_pair() if callable(get_pair) else get_pair
    progress(0.0, desc="starting")
    last, written = None, -math.inf
    choices = [(f"{p.id} ({p.kind})", p.id) for p in records]
    with COMPUTE_LOCK:  # takes turns with races and the background profile
        for update in sweep(pair, records, grid, max_new, cost_profile=profile,
                            on_progress=lambda f, msg: progress(f, desc=msg), should_stop=should_stop):
            last = update
            # the CSV grows with every prompt: written every CSV_EVERY_S and at the end, not per prompt (each copy
            # stays on disk, and Gradio keeps its own for an hour)
            path = gr.skip()
            if update.done == update.total or time.perf_counter() - written >= CSV_EVERY_S:
                path, written = _write_csv(update.runs), time.perf_counter()
            best = best_settings(update.summary)
            strategies = [p.spec for p in grid if p.spec in set(update.summary.get("strategy", []))]
            pick = best.get("best_threshold") or REFERENCE_SETTING
            state = {"records": {p.id: p for p in records}, "prompts": [p.id for p in records], "max_new_tokens": max_new,
                     "specs": strategies, "cost_profile": profile, "summary": update.summary}
            kinds = [ALL] + sorted(set(update.runs["kind"])) if not update.runs.empty else [ALL]
            yield (status_line(update.summary, update.done, update.total, time.perf_counter() - start, profile)
                   + fit_words(update), heatmap_figure(update.summary), top_settings(update.summary),
                   gr.update(choices=strategies, value=pick if pick in strategies else None),
                   gr.update(choices=choices, value=records[0].id), path, state, kinds_table(update.runs),
                   gr.update(choices=kinds, value=ALL))
    if should_stop() and (last is None or last.done < last.total):
        kept = (f"the {last.done} completed prompt(s) above are kept (CSV included)" if last is not None
                else "no prompt was completed")
        why = f" ({deadline.reason()})" if deadline.ended_the_run() else ""
        # every completed prompt in the CSV, however recently the last one was written
        path = _write_csv(last.runs) if last is not None else gr.skip()
        yield (f"■ **Stopped** after {time.perf_counter() - start:.1f} s{why}: {kept}; press **Run sweep** "
               "to go on (completed prompts are cached and replay instantly).", *_skip_all(4), path, *_skip_all(3))
    elif last is None:
        yield ("Nothing was replayed.", *_skip_all(8))


def build_sweep_tab(get_pair, gate=None) -> None:
    """Create the Sweep tab's widgets and events (call inside an open ``gr.Tab``); ``gate``
    (``disco.app.visitors.VisitorGate``) holds each visitor to their share of the queue."""
    stops = StopSignals()
    try:
        suite = sweep_suites.load(sweep_suites.BUILTIN, None)
    except BenchError as exc:
        gr.Markdown(f"The prompt suite could not be read: {exc}")
        return
    w = _layout(suite)

    def sweep_run(raw: dict, request: gr.Request = None, progress=None, records=None):
        """The Run event: ``raw``, the controls' values by name (``SWEEP_CONTROLS``); ``records``: the prompts of
        the last sweep (re-costing), instead of the suite's."""
        start = time.perf_counter()
        should_stop = stops.for_request(request)
        progress = progress if progress is not None else (lambda *a, **k: None)
        try:
            req = SWEEP_CONTROLS.parse(raw)
            budgets = limits.Budgets.from_env()
            profile = profile_choice(req.profile_menu, req.profile_csv)
            grid = grid_policies(req.static_text, req.tau_text, req.kmax_text, req.use_heuristic, req.use_oracle,
                                 budgets.max_lookahead, req.rule_choice)
            if records is None:
                suite = sweep_suites.load(req.suite_menu or sweep_suites.BUILTIN, req.suite_file)
                records = sweep_suites.picked(suite, req.prompt_ids, req.sample_n, req.sample_seed)
            if not 8 <= req.max_new <= MAX_SWEEP_TOKENS:
                raise BenchError(f"max new tokens must be between 8 and {MAX_SWEEP_TOKENS}, got {req.max_new}")
            limits.check_sweep(len(grid), len(records), req.max_new, budgets)
            deadline = limits.Deadline(budgets.run_s)
            should_stop = deadline.stop_check(should_stop)
            yield from _stream(get_pair, records, grid, req.max_new, profile, should_stop, deadline, progress, start)
        except (UserError, ValueError, RuntimeError) as exc:
            if not isinstance(exc, UserError):  # a fault of ours or of an engine: its traceback goes to the log
                log.exception("sweep failed")
            yield (f"⚠ {first_line(exc)}", *_skip_all(8))

    # the /sweep API: the controls' names and defaults, in their declared order (disco.app.sweep_controls)
    run_sweep = SWEEP_CONTROLS.handler(sweep_run, "run_sweep", progress=True)
    recost = zerogpu.gpu(sweep_run, limits.Budgets.from_env().run_s)  # re-costing may run models too
    run_sweep = zerogpu.gpu(run_sweep, limits.Budgets.from_env().run_s)  # a no-op off a ZeroGPU Space

    def show_detail(spec, prompt_id, st):
        if not spec or not prompt_id or not st or prompt_id not in st.get("records", {}):
            return gr.skip(), gr.skip()
        try:
            pair = get_pair() if callable(get_pair) else get_pair
            with COMPUTE_LOCK:  # may decode a chain: never beside a timed race or the background profile
                frame = replay_iterations(pair, st["records"][prompt_id], parse_strategy(spec),
                                          int(st.get("max_new_tokens", 48)), cost_profile=st.get("cost_profile"))
        except (UserError, ValueError, RuntimeError, KeyError) as exc:
            if not isinstance(exc, UserError):
                log.exception("the sweep's detail replay failed")
            gr.Warning(first_line(exc))
            return gr.skip(), gr.skip()
        return detail_view(frame, spec, prompt_id)

    def redraw(*args, progress=gr.Progress(), request: gr.Request = None):
        """A new cost profile re-costs the last sweep's prompts and grid from their cached tables (seconds)."""
        *values, st = args
        if not st or not st.get("records"):
            yield _skip_all()
            return
        raw = dict(zip(SWEEP_CONTROLS.names, values))
        raw["max_new"] = st.get("max_new_tokens", raw["max_new"])  # the last sweep's, whatever the slider says now
        yield from recost(raw, request=request, progress=progress, records=list(st["records"].values()))

    show_detail = zerogpu.gpu(show_detail, limits.Budgets.from_env().run_s)  # it may decode a chain

    _wire(w, stops, run_sweep, show_detail, redraw, _heatmap_of, _on_suite, gate)
    sweep_batch.build(w.state, get_pair, gate)


def _heatmap_of(kind, st):
    """The heatmap of the last sweep, for one kind of prompt (or all)."""
    if not st or st.get("summary") is None:
        return gr.skip()
    return heatmap_figure(kind_slice(st["summary"], kind or ALL),
                          title=None if kind in (None, ALL) else f"Speed-up over τ × KMAX: {kind} prompts")


def _on_suite(menu, upload):
    """A suite picked or uploaded: its prompts as the choices, and one line on what it holds."""
    try:
        chosen = sweep_suites.load(menu, upload)
    except (UserError, ValueError) as exc:
        return gr.skip(), f"⚠ {first_line(exc)}"
    shown = f" (the first {sweep_suites.CHOICES_SHOWN} listed; a sample reaches all)" \
        if len(chosen.prompts) > sweep_suites.CHOICES_SHOWN else ""
    return (gr.update(choices=sweep_suites.choices(chosen), value=sweep_suites.default_ticks(chosen)),
            f"{chosen.name}: {len(chosen.prompts)} prompts in {len(chosen.kinds)} kind(s){shown}"
            + (f"; {len(chosen.dropped)} unusable rows left out" if chosen.dropped else "") + ".")

def _wire(w: _Widgets, stops, run_sweep, show_detail, redraw, heatmap_of, on_suite, gate=None) -> None:
    """The tab's events: Run and Stop, the detail view after a run, re-costing on a new profile, the kind's heatmap,
    a new suite's prompts. Every event that takes the compute turn goes through ``gate`` (one run per visitor,
    refused before it is queued)."""
    def gated(fn, inputs: list) -> dict:
        return {"validator": gate.validator_for(fn, len(inputs))} if gate is not None else {}

    def compute(fn, inputs: list) -> dict:
        return {"concurrency_id": "compute", **gated(fn, inputs)}

    outputs, detail = w.outputs(), [w.setting, w.detail_prompt, w.state]
    details = [w.detail_plot, w.detail_table]
    # Stop asks the sweep to end at its next progress report: the prompt in progress is dropped, completed
    # ones are kept (see disco.app.session.StopSignals)
    # preprocess=False: run_sweep checks every raw value itself (disco.app.sweep_inputs), so a caller who sends the
    # wrong type gets our one line, not Gradio's several-line preprocessing report
    run_event = stops.wire(w.run, w.stop, run_sweep, w.run_inputs(), outputs, api_name="sweep", concurrency_limit=1,
                           show_progress="full", show_progress_on=[w.status], preprocess=False,
                           **compute(run_sweep, w.run_inputs()))
    run_event.then(show_detail, detail, details, api_visibility="private", **compute(show_detail, detail))
    for widget in (w.profile_menu, w.profile_csv):
        widget.change(redraw, w.run_inputs() + [w.state], outputs, api_visibility="private", show_progress="minimal",
                      **compute(redraw, w.run_inputs() + [w.state])).then(
            show_detail, detail, details, api_visibility="private", **compute(show_detail, detail))
    for widget in (w.setting, w.detail_prompt):
        widget.input(show_detail, detail, details, api_visibility="private", **compute(show_detail, detail))
    # a heatmap from the last sweep's summary: cheap, so unqueued (it holds no place in the shared queue)
    w.heatmap_kind.input(heatmap_of, [w.heatmap_kind, w.state], [w.heatmap], api_visibility="private", queue=False)
    for widget in (w.suite_menu, w.suite_file):  # parsing an upload holds a place in the queue: one per visitor
        widget.change(on_suite, [w.suite_menu, w.suite_file], [w.prompt_ids, w.status], api_visibility="private",
                      **gated(on_suite, [w.suite_menu, w.suite_file]))
