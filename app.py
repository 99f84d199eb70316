"""DISCO Lab: static vs dynamic speculation lookahead, side by side (Gradio app: layout and wiring; logic in disco/app/).

    python app.py                      # the embedded Qwen2.5-Coder 1.5B/0.5B pair
    DISCO_MODELS=tiny python app.py    # tiny random models: instant, for trying the UI
"""

from __future__ import annotations

import os
import sys

import gradio as gr

from disco import limits
from disco.errors import UserError, first_line
from disco.app import about, machine_plots, plots, race_batch, race_tab as ui, zerogpu
from disco.app.lanes import LANES_CSS, summary_frame
from disco.app.loader import ModelLoader
from disco.app.race_inputs import RACE_CONTROLS
from disco.app.session import STOP_LABEL, StopSignals
from disco.app.sweep_tab import build_sweep_tab
from disco.app.visitors import QueueRules, VisitorGate

THEME = gr.themes.Soft(primary_hue="orange", neutral_hue="slate")
PAGE_CSS = ".gradio-container { max-width: 1600px !important; } #disco-status p { margin: 0; }"


def _measured(prof):
    """This machine's batch-1 cost model from its profile (None while it is measured)."""
    return prof.cost_model_near(None) if prof is not None and prof.precisions else None


def _race_tab(loader, budgets) -> tuple[dict, list, gr.Button, gr.Button]:
    """The Race tab's layout: its controls by name (``RACE_CONTROLS`` makes each), its outputs in
    ``race_tab.OUTPUT_LABELS`` order, and the Run and Stop buttons."""
    c = {}
    with gr.Row():
        with gr.Column(scale=5):
            c["prompt"] = RACE_CONTROLS["prompt"].make()
            gr.Examples(ui.EXAMPLES, inputs=[c["prompt"]], label="Examples: code, explanation, summary, story",
                        cache_examples=False)
        with gr.Column(scale=4):
            with gr.Row():
                c["lane_a"], c["lane_b"] = RACE_CONTROLS["lane_a"].make(), RACE_CONTROLS["lane_b"].make()
            with gr.Row():
                c["lane_a_assistant"] = RACE_CONTROLS["lane_a_assistant"].make()
                c["lane_b_assistant"] = RACE_CONTROLS["lane_b_assistant"].make()
            engines = loader.engines()  # one engine per run; a menu only where there is a choice
            c["engine"] = RACE_CONTROLS["engine"].make(
                choices=[ui.DEFAULT_ENGINE] + [e for e in engines[1:]], visible=len(engines) > 1,
                info=f"default: {engines[0] if engines else '?'} (this app's); the other one loads on its first run")
            # the sliders end at the operator's limits (disco.limits); each policy's parameters name the shared
            # slider that fills them (disco.policies metadata)
            for name, most in (("k", budgets.max_lookahead), ("threshold", None),
                               ("max_lookahead", budgets.max_lookahead)):
                ranged = {"maximum": most, "value": min(RACE_CONTROLS[name].default, most)} if most else {}
                c[name] = RACE_CONTROLS[name].make(**ranged)
            with gr.Row():
                most = budgets.max_new_tokens
                c["max_new_tokens"] = RACE_CONTROLS["max_new_tokens"].make(
                    maximum=most, value=min(RACE_CONTROLS["max_new_tokens"].default, most))
                with gr.Column(min_width=160, scale=2):
                    c["baseline"], c["chat"] = RACE_CONTROLS["baseline"].make(), RACE_CONTROLS["chat"].make()
            with gr.Accordion("Sampling", open=False):
                c["sample"] = RACE_CONTROLS["sample"].make()
                with gr.Row():
                    for name in ("temperature", "top_p", "seed"):
                        c[name] = RACE_CONTROLS[name].make()
            with gr.Row():
                run = gr.Button("▶ Run", variant="primary", elem_id="run")
                stop = gr.Button(STOP_LABEL, variant="stop", elem_id="stop")
    outputs = _race_outputs(budgets)
    race_batch.build(outputs[ui.OUTPUT_LABELS.index("iterations_csv")],
                     measured=lambda: _measured(loader.get_profile()))
    return c, outputs, run, stop


def _race_outputs(budgets) -> list:
    """The race's outputs, top to bottom, in ``race_tab.OUTPUT_LABELS`` order."""
    out = {"status": gr.Markdown(f"Ready: press **Run**. <small>This app's {budgets.words()} (runs take turns; a "
                                 "queued run shows its position).</small>", elem_id="run-status", min_height=48),
           "lanes": gr.HTML(ui.empty_lanes_html(), css_template=LANES_CSS, js_on_load=None, elem_id="lanes")}
    titles = {"race": plots.RACE_TITLE, "lookahead": plots.LOOKAHEAD_TITLE, "latency": plots.LATENCY_TITLE,
              "confidence": plots.CONFIDENCE_TITLE, "positions": plots.POSITIONS_TITLE}
    for row in (("race", "lookahead"), ("latency", "confidence"), ("positions",)):
        with gr.Row():
            for name in row:
                out[name] = gr.Plot(plots.empty_figure(titles[name]), show_label=False, elem_id=f"plot-{name}")
    out["summary"] = gr.Dataframe(summary_frame([]), label="Summary", interactive=False, elem_id="summary")
    with gr.Row():
        for name, what in (("iterations_csv", "per-iteration trace"), ("tokens_csv", "per-token trace"),
                           ("positions_csv", "acceptance by draft position")):
            out[name] = gr.File(label=f"Download CSV: {what}", elem_id=name.replace("_", "-"))
    return [out[name] for name in ui.OUTPUT_LABELS]


def build_demo(models: str | None = None) -> gr.Blocks:
    # The page's layout, top to bottom, in one place (Gradio layout is declarative); the logic is in disco/app/.
    loader = ModelLoader(models or os.environ.get("DISCO_MODELS", "embedded")).start()
    stops = StopSignals()

    def run_race(raw: dict, request: gr.Request = None):
        yield from ui.compare(loader.get, raw, should_stop=stops.for_request(request),
                              get_profile=lambda: loader.get_profile(ui.engine_name(raw.get("engine"))))

    # the /compare API: the race's controls' names and defaults, in their declared order (disco.app.race_inputs)
    compare = RACE_CONTROLS.handler(run_race, "compare")
    budgets = limits.Budgets.from_env()
    compare = zerogpu.gpu(compare, budgets.run_s)  # a no-op off a ZeroGPU Space
    gate = VisitorGate(QueueRules.from_env(), lambda: getattr(demo, "_queue", None))  # one run per visitor

    # Gradio copies every returned file into its cache: delete copies older than an hour, checked every 10 min
    with gr.Blocks(title="DISCO Lab: dynamic speculation lookahead", delete_cache=(600, 3600)) as demo:
        gr.Markdown("# DISCO Lab\nSpeculative decoding with a **static** and a **dynamic** speculation lookahead "
                    "(a confidence threshold, or adaptive, entropy, cumulative, cost-aware and trained DISCO stopping "
                    "rules), racing side by side against the target model alone.")
        model_status = gr.Markdown(loader.status(), elem_id="disco-status")
        with gr.Tab("Race"):
            c, outputs, run, stop = _race_tab(loader, budgets)
        with gr.Tab("Sweep"):
            build_sweep_tab(loader.get, gate)
        with gr.Tab("This machine"):
            machine_md = gr.Markdown("○ waiting for the models…", elem_id="machine")
            with gr.Row():
                machine_cost = gr.Plot(plots.empty_figure(machine_plots.MACHINE_COST_TITLE, "waiting for the models…"),
                                       show_label=False, elem_id="plot-machine-cost")
                machine_speedup = gr.Plot(plots.empty_figure(machine_plots.MACHINE_SPEEDUP_TITLE, "waiting for the models…"),
                                          show_label=False, elem_id="plot-machine-speedup")
        with gr.Tab("About"):
            gr.Markdown(about.about_md(), latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                                       {"left": "$", "right": "$", "display": False}])

        inputs = RACE_CONTROLS.inputs(c)
        # Stop ends the race at its next transformer layer, dropping the unfinished iteration; the race itself
        # then shows "Stopped" with the partial trace (see disco.app.session.StopSignals)
        # preprocess=False: compare checks every value itself (disco.limits, the engine), so a caller who sends a
        # string for a slider gets our one-line message, not Gradio's multi-line preprocessing report
        stops.wire(run, stop, compare, inputs, outputs, api_name="compare", concurrency_id="compute",
                   concurrency_limit=1, show_progress="full", show_progress_on=[outputs[0]], preprocess=False,
                   validator=gate.validator_for(compare, len(inputs)))
        # the status line and the This-machine tab: polled by a timer per page, each tick a cheap unqueued call that
        # sends something only when it changed, stopped once the models and the profile are ready (no stream holds
        # a worker or a queue place for every open page)
        ticker = gr.Timer(2.0)
        ticker.tick(loader.poll, [model_status, machine_md], [model_status, machine_md, machine_cost, machine_speedup,
                                                              ticker], queue=False, api_visibility="private",
                    show_progress="hidden")
        demo.load(loader.poll, [model_status, machine_md], [model_status, machine_md, machine_cost, machine_speedup,
                                                            ticker], queue=False, api_visibility="private",
                  show_progress="hidden")
    return demo


IDLE_POLL_S = 0.05  # Gradio's queue checks for work every 1 ms when idle (measured: ~3.5 % of a core, idle)


def quiet_queue(demo: gr.Blocks) -> gr.Blocks:
    """Make the idle app idle: Gradio's queue polls for new events every 1 ms and for progress every 10 ms;
    every 50 / 100 ms is plenty for runs that take seconds. (Attributes of Gradio's Queue, version pinned in
    requirements.txt; tests/app/test_ui.py fails if they go away.)"""
    queue = demo._queue
    queue.sleep_when_free = max(queue.sleep_when_free, IDLE_POLL_S)
    queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, 2 * IDLE_POLL_S)
    return demo


def launch_kwargs() -> dict:
    # show_error: Gradio's own input checks (a slider given "abc") reach the caller as their one-line message
    # instead of a generic "has raised an exception"; our handlers turn everything else into one line themselves
    return {"theme": THEME, "css": PAGE_CSS, "show_error": True, "max_file_size": limits.upload_limit()}


def queued(demo: gr.Blocks) -> gr.Blocks:
    """The app's queue: one run at a time (timings never share the CPU), at most ``DISCO_QUEUE_MAX`` runs waiting
    (``disco.app.visitors``), polled slowly when idle."""
    # api_open=False: Gradio's direct REST routes would skip the queue (and so the one-run-per-visitor check)
    return quiet_queue(demo.queue(default_concurrency_limit=1, max_size=QueueRules.from_env().max_size,
                                  api_open=False))


def check_operator_settings() -> None:
    """Every operator variable read at start-up, so a bad one stops the app with one line before anything loads."""
    from disco.app.loader import offered_engines
    from disco.models import llama

    limits.Budgets.from_env()
    QueueRules.from_env()
    offered_engines()
    llama.threads()
    llama.n_ctx()
    limits.upload_limit()


def main() -> int:
    try:
        check_operator_settings()
        demo = build_demo()
    except UserError as exc:
        print(f"disco: error: {first_line(exc)}", file=sys.stderr)
        return 2
    queued(demo).launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")), **launch_kwargs())
    return 0


if __name__ == "__main__":
    sys.exit(main())
