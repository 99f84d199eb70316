"""The app's Sweep tab: replay a grid of lookahead settings on suite prompts and watch the heatmap fill in.

``build_sweep_tab(get_pair)`` is called by app.py inside an open ``gr.Tab``. All the work is done by
``disco.bench.sweep.sweep`` (exact greedy replay, see ``disco.replay``); this file only wires widgets. The grid's
text fields become ``Policy`` objects once (``grid_policies``); tables live in the one cache, so prompts the
background profile or an earlier sweep replayed cost no model work.
A heatmap cell is chosen with the "Setting" dropdown (Gradio 6's ``gr.Plot`` has no click event).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from disco import limits
from disco.app import plots, zerogpu
from disco.app.session import COMPUTE_LOCK, STOP_LABEL, StopSignals
from disco.bench.analysis import REFERENCE_SETTING, best_settings
from disco.bench.heatmap import heatmap_figure
from disco.bench.suite import KINDS, BenchError, load_suite, pick_prompts
from disco.bench.sweep import replay_iterations, sweep
from disco.costs import model as cost_mod
from disco.errors import UserError, first_line
from disco.policies import AUTOREGRESSIVE, KMAXES, STATIC_KS, Policy, parse_strategy, policy_class, policy_kinds
from disco.policies.export import take_away, take_away_md
from disco.policies.grids import CLASSIC_KINDS, COARSE_TAUS, default_grid, rule_kinds

DEFAULT_TAUS = ",".join(format(t, "g") for t in COARSE_TAUS)
DEFAULT_STATIC = ",".join(str(k) for k in STATIC_KS)
DEFAULT_KMAXES = ",".join(str(k) for k in KMAXES)
MAX_SWEEP_TOKENS = 256  # the slider's end
RULE_CHOICES = [cls.kind for cls in policy_kinds() if cls.kind not in CLASSIC_KINDS]  # adaptive, entropy, ...
MAX_FIELD_CHARS = 2000  # a grid field; the settings limit (limits.Budgets) is checked once the grid is built
KEEP_SWEEP_CSVS = 40  # sweep CSVs kept on disk for downloads (older ones are deleted; Gradio keeps its own copy)
DETAIL_COLUMNS = ["iteration", "lookahead", "accepted", "emitted", "stop_reason", "min_confidence", "max_lookahead",
                  "draft_ms", "verify_ms", "new_tokens"]
SUMMARY_COLUMNS = ["strategy", "prompts", "speedup_geomean", "speedup_min", "speedup_max", "acceptance_rate_mean",
                   "mean_lookahead_mean"]


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


def csv_path() -> Path:
    """A fresh file for one sweep update's CSV in one folder, which keeps the newest KEEP_SWEEP_CSVS."""
    directory = Path(tempfile.gettempdir()) / "disco-sweep"
    directory.mkdir(parents=True, exist_ok=True)
    old = sorted(directory.glob("sweep-runs-*.csv"), key=lambda p: p.stat().st_mtime)
    for path in old[: max(0, len(old) - KEEP_SWEEP_CSVS + 1)]:
        path.unlink(missing_ok=True)
    return directory / f"sweep-runs-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns() % 1_000_000_000:09d}.csv"


def top_settings(summary: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    if summary is None or summary.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    rows = summary[(summary["mode"] == "replay") & (summary["kind"] == "all")]
    rows = rows.sort_values("speedup_geomean", ascending=False)
    keep = set(rows["strategy"].head(n)) | {AUTOREGRESSIVE, REFERENCE_SETTING}
    best = best_settings(summary)
    keep |= {v for k, v in best.items() if k.startswith("best_") and isinstance(v, str)}
    out = rows[rows["strategy"].isin(keep)][SUMMARY_COLUMNS].copy()
    for c in SUMMARY_COLUMNS[2:]:
        out[c] = out[c].astype(float).round(3)
    return out


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


def _profile_words(profile: str) -> str:
    if profile == cost_mod.MEASURED:
        return "per-pass costs measured on this machine"
    if profile.startswith("flat:"):
        return (f"cost profile `{profile}`: every target pass one step, every assistant pass {profile[5:]} of a "
                "step, as on a GPU with a tiny draft; iterations exact, costs hypothetical")
    return f"per-pass costs from the uploaded CSV `{Path(profile).name}`"


def _status(summary: pd.DataFrame, done: int, total: int, seconds: float, profile: str = cost_mod.MEASURED) -> str:
    best = best_settings(summary)
    if not best:
        return f"{done}/{total} prompts replayed ({seconds:.0f} s)"
    fmt = lambda v: "—" if v is None or v != v else f"{v:.2f}x"  # noqa: E731
    return (f"**{done}/{total} prompts replayed** ({seconds:.0f} s). Best static: `{best.get('best_static')}` "
            f"{fmt(best.get('best_static_speedup'))} · `{REFERENCE_SETTING}` {fmt(best.get('reference_speedup'))} · "
            f"best threshold: `{best.get('best_threshold')}` {fmt(best.get('best_threshold_speedup'))} · "
            + "".join(f"best {kind}: `{best[f'best_{kind}']}` {fmt(best.get(f'best_{kind}_speedup'))} · "
                      for kind in RULE_CHOICES if best.get(f"best_{kind}"))
            + f"oracle {fmt(best.get('best_oracle_speedup'))}. Speed-ups are geometric means of estimated times "
            f"({_profile_words(profile)}).") + _take_away(best)


def _take_away(best: dict) -> str:
    """The grid's best cell (the oracle aside) as configuration for the engines people deploy with."""
    cells = {v: best.get(f"{k}_speedup", math.nan) for k, v in best.items()
             if k.startswith("best_") and not k.endswith("_speedup") and k != "best_oracle" and isinstance(v, str)}
    cells = {spec: value for spec, value in cells.items() if value == value}
    if not cells:
        return ""
    spec = max(cells, key=cells.get)
    block = take_away_md(take_away(parse_strategy(spec)))
    return (f"\n\n<details><summary>the best cell, `{spec}` ({cells[spec]:.2f}x), for transformers, llama.cpp and "
            f"vLLM</summary>\n\n{block}\n\n</details>")


def build_sweep_tab(get_pair) -> None:
    """Create the Sweep tab's widgets and events (call inside an open ``gr.Tab``)."""
    # Long because Gradio layout is declarative: the widgets, then the handlers that close over them.
    stops = StopSignals()
    try:
        suite = load_suite()
    except BenchError as exc:
        gr.Markdown(f"The prompt suite could not be read: {exc}")
        return
    by_id = {p.id: p for p in suite}
    choices = [(f"{p.id} ({p.kind})", p.id) for p in suite]
    default_prompts = [p.id for p in pick_prompts(suite, len(KINDS))]

    gr.Markdown(
        "Replay a grid of lookahead settings on prompts from the benchmark suite. Greedy decoding makes this exact: "
        "the target's output and the assistant's drafts along it are computed once per prompt (cached), then every "
        "setting is replayed without the models, its time estimated from per-pass costs measured here. "
        "The first run on a prompt takes about as long as decoding it twice; re-runs are instant.")
    with gr.Row():
        with gr.Column(scale=3):
            prompts = gr.CheckboxGroup(choices, value=default_prompts, label="Prompts", elem_id="sweep-prompts")
        with gr.Column(scale=2):
            static_ks = gr.Textbox(DEFAULT_STATIC, label="Static K values", elem_id="sweep-static")
            taus = gr.Textbox(DEFAULT_TAUS, label="Thresholds τ", elem_id="sweep-taus")
            kmaxes = gr.Textbox(DEFAULT_KMAXES, label="KMAX values", elem_id="sweep-kmaxes")
            with gr.Row():
                heuristic = gr.Checkbox(True, label="heuristic:5")
                oracle = gr.Checkbox(True, label="oracle (upper bound)")
            rules = gr.CheckboxGroup(RULE_CHOICES, value=rule_kinds(), elem_id="sweep-rules",
                                     label="More stopping rules (each over its own parameter grid, with these KMAX values)",
                                     info=" · ".join(f"{cls.template()}" for cls in policy_kinds()
                                                     if cls.kind in RULE_CHOICES))
            max_new_tokens = gr.Slider(8, MAX_SWEEP_TOKENS, value=48, step=8, label="Max new tokens", elem_id="sweep-max-new-tokens")
            with gr.Row():
                cost_profile = gr.Dropdown(list(cost_mod.PRESETS), value=cost_mod.MEASURED, allow_custom_value=True,
                                           label="Cost profile (measured, or flat:C = a GPU-like regime)",
                                           elem_id="sweep-cost-profile", interactive=True)
                cost_csv = gr.File(label="…or a per-pass cost CSV (python -m disco profile --csv)", file_types=[".csv"],
                                   type="filepath", elem_id="sweep-cost-csv")
            with gr.Row():
                run = gr.Button("▶ Run sweep", variant="primary", elem_id="sweep-run")
                stop = gr.Button(STOP_LABEL, variant="stop", elem_id="sweep-stop")
    status = gr.Markdown("Pick prompts and a grid, then press **Run sweep**.", elem_id="sweep-status", min_height=48)
    heatmap = gr.Plot(plots.empty_figure("Speed-up over τ × KMAX", "press Run sweep"), show_label=False,
                      elem_id="sweep-heatmap")
    table = gr.Dataframe(pd.DataFrame(columns=SUMMARY_COLUMNS), label="Best settings (geometric-mean speed-up)",
                         interactive=False, elem_id="sweep-summary")
    with gr.Row():
        setting = gr.Dropdown([], label="Setting (a heatmap cell, or any replayed strategy)", elem_id="sweep-setting",
                              interactive=True)
        detail_prompt = gr.Dropdown(choices, value=default_prompts[0] if default_prompts else None, label="Prompt",
                                    elem_id="sweep-detail-prompt", interactive=True)
    detail_plot = gr.Plot(plots.empty_figure(plots.LOOKAHEAD_TITLE, "run a sweep, then pick a setting"),
                          show_label=False, elem_id="sweep-detail-plot")
    detail_table = gr.Dataframe(pd.DataFrame(columns=DETAIL_COLUMNS), label="Per iteration (replayed)",
                                interactive=False, elem_id="sweep-detail")
    csv_file = gr.File(label="Download CSV: one row per prompt × setting", elem_id="sweep-csv")
    state = gr.State({})

    def run_sweep(prompt_ids, static_text, tau_text, kmax_text, use_heuristic, use_oracle, max_new,
                  profile_menu=cost_mod.MEASURED, profile_csv=None, rule_choice=(), progress=gr.Progress(),
                  request: gr.Request = None):
        start = time.perf_counter()
        should_stop = stops.for_request(request)
        try:
            budgets = limits.Budgets.from_env()
            profile = profile_choice(profile_menu, profile_csv)
            grid = grid_policies(static_text, tau_text, kmax_text, use_heuristic, use_oracle, budgets.max_lookahead,
                                 rule_choice)
            if isinstance(prompt_ids, str):
                prompt_ids = [prompt_ids]
            unknown = [i for i in (prompt_ids or []) if i not in by_id]
            if unknown:
                raise BenchError(f"unknown suite prompt {str(unknown[0])[:80]!r}")
            picked = [by_id[i] for i in dict.fromkeys(prompt_ids or [])]
            if not picked:
                raise BenchError("pick at least one prompt")
            max_new = limits.as_int(max_new, "max new tokens")
            if not 8 <= max_new <= MAX_SWEEP_TOKENS:
                raise BenchError(f"max new tokens must be between 8 and {MAX_SWEEP_TOKENS}, got {max_new}")
            limits.check_sweep(len(grid), len(picked), max_new, budgets)
            deadline = limits.Deadline(budgets.run_s)
            should_stop = deadline.stop_check(should_stop)
            yield ("Loading the models ...", gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
            pair = get_pair() if callable(get_pair) else get_pair
            progress(0.0, desc="starting")
            last = None
            with COMPUTE_LOCK:  # takes turns with races and the background profile
                for update in sweep(pair, picked, grid, max_new, cost_profile=profile,
                                    on_progress=lambda f, msg: progress(f, desc=msg), should_stop=should_stop):
                    last = update
                    path = csv_path()
                    update.runs.to_csv(path, index=False)
                    best = best_settings(update.summary)
                    strategies = [p.spec for p in grid if p.spec in set(update.summary["strategy"])]
                    pick = best.get("best_threshold") or REFERENCE_SETTING
                    new_state = {"prompts": [p.id for p in picked], "max_new_tokens": max_new, "specs": strategies,
                                 "cost_profile": profile}
                    yield (_status(update.summary, update.done, update.total, time.perf_counter() - start, profile),
                           heatmap_figure(update.summary), top_settings(update.summary),
                           gr.update(choices=strategies, value=pick if pick in strategies else None),
                           gr.update(choices=[c for c in choices if c[1] in new_state["prompts"]],
                                     value=new_state["prompts"][0]),
                           str(path), new_state)
            if should_stop() and (last is None or last.done < last.total):
                kept = (f"the {last.done} completed prompt(s) above are kept (CSV included)" if last is not None
                        else "no prompt was completed")
                why = f" ({deadline.reason()})" if deadline.ended_the_run() else ""
                yield (f"■ **Stopped** after {time.perf_counter() - start:.1f} s{why}: {kept}; press **Run sweep** "
                       "to go on (completed prompts are cached and replay instantly).",
                       gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
            elif last is None:
                yield ("Nothing was replayed.", gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
        except (UserError, ValueError, RuntimeError) as exc:
            yield (f"⚠ {first_line(exc)}", gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())

    run_sweep = zerogpu.gpu(run_sweep, limits.Budgets.from_env().run_s)  # a no-op off a ZeroGPU Space

    def show_detail(spec, prompt_id, st):
        if not spec or not prompt_id or not st:
            return gr.skip(), gr.skip()
        try:
            pair = get_pair() if callable(get_pair) else get_pair
            frame = replay_iterations(pair, by_id[prompt_id], parse_strategy(spec), int(st.get("max_new_tokens", 48)),
                                      cost_profile=st.get("cost_profile"))
        except (UserError, ValueError, RuntimeError, KeyError) as exc:
            gr.Warning(str(exc))
            return gr.skip(), gr.skip()
        view = frame[DETAIL_COLUMNS].copy()
        for c in ("min_confidence", "draft_ms", "verify_ms"):
            view[c] = view[c].astype(float).round(3)
        if spec == AUTOREGRESSIVE:
            figure = plots.empty_figure(plots.LOOKAHEAD_TITLE, "autoregressive drafts nothing")
        else:
            figure = plots.lookahead_figure(frame, [spec])
        seconds = float(frame["elapsed_ms"].iloc[-1]) / 1000.0 if not frame.empty else math.nan
        figure.update_layout(title=dict(text=f"{spec} on {prompt_id}: {len(frame)} iterations, "
                                             f"{int(frame['new_tokens'].iloc[-1])} tokens, ~{seconds:.1f} s estimated"))
        return figure, view

    outputs = [status, heatmap, table, setting, detail_prompt, csv_file, state]
    # Stop asks the sweep to end at its next progress report: the prompt in progress is dropped, completed
    # ones are kept (see disco.app.session.StopSignals)
    inputs = [prompts, static_ks, taus, kmaxes, heuristic, oracle, max_new_tokens, cost_profile, cost_csv, rules]
    run_event = stops.wire(run, stop, run_sweep, inputs, outputs, api_name="sweep", concurrency_id="compute", concurrency_limit=1,
                           show_progress="full", show_progress_on=[status])
    run_event.then(show_detail, [setting, detail_prompt, state], [detail_plot, detail_table],
                   api_visibility="private", concurrency_id="compute")

    def redraw(prompt_ids, static_text, tau_text, kmax_text, use_heuristic, use_oracle, max_new, profile_menu,
               profile_csv, rule_choice, st, progress=gr.Progress(), request: gr.Request = None):
        """A new cost profile re-costs the last sweep's prompts and grid from their cached tables (seconds)."""
        if not st or not st.get("prompts"):
            yield tuple(gr.skip() for _ in outputs)
            return
        yield from run_sweep(st["prompts"], static_text, tau_text, kmax_text, use_heuristic, use_oracle,
                             st.get("max_new_tokens", max_new), profile_menu, profile_csv, rule_choice, progress, request)

    for widget in (cost_profile, cost_csv):
        widget.change(redraw, inputs + [state], outputs, api_visibility="private", concurrency_id="compute",
                      show_progress="minimal").then(show_detail, [setting, detail_prompt, state],
                                                    [detail_plot, detail_table], api_visibility="private",
                                                    concurrency_id="compute")
    for widget in (setting, detail_prompt):
        widget.input(show_detail, [setting, detail_prompt, state], [detail_plot, detail_table],
                     api_visibility="private", concurrency_id="compute")
