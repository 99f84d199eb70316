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
from disco.app import about, plots, race_batch, race_tab as ui, zerogpu
from disco.app.lanes import LANES_CSS, summary_frame
from disco.app.loader import ModelLoader
from disco.app.session import STOP_LABEL, StopSignals
from disco.app.sweep_tab import build_sweep_tab
from disco.app.visitors import QueueRules, VisitorGate

THEME = gr.themes.Soft(primary_hue="orange", neutral_hue="slate")
PAGE_CSS = ".gradio-container { max-width: 1600px !important; } #disco-status p { margin: 0; }"


def _measured(prof):
    """This machine's batch-1 cost model from its profile (None while it is measured)."""
    return prof.cost_model_near(None) if prof is not None and prof.precisions else None


def build_demo(models: str | None = None) -> gr.Blocks:
    # The page's layout, top to bottom, in one place (Gradio layout is declarative); the logic is in disco/app/.
    loader = ModelLoader(models or os.environ.get("DISCO_MODELS", "embedded")).start()
    stops = StopSignals()
    d = ui.DEFAULTS

    def compare(prompt, lane_a=d.lane_a, lane_b=d.lane_b, k=d.k, threshold=d.threshold, max_lookahead=d.max_lookahead,
                max_new_tokens=d.max_new_tokens, baseline=d.baseline, chat=d.chat, sample=d.sample,
                temperature=d.temperature, top_p=d.top_p, seed=d.seed, lane_a_assistant=ui.DEFAULT_ASSISTANT,
                lane_b_assistant=ui.DEFAULT_ASSISTANT, engine=ui.DEFAULT_ENGINE, request: gr.Request = None):
        yield from ui.compare(loader.get, prompt, lane_a, lane_b, k, threshold, max_lookahead, max_new_tokens,
                              baseline, chat, sample, temperature, top_p, seed, lane_a_assistant, lane_b_assistant,
                              engine, should_stop=stops.for_request(request),
                              get_profile=lambda: loader.get_profile(ui.engine_name(engine)))

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
            with gr.Row():
                with gr.Column(scale=5):
                    prompt = gr.Textbox(label="Prompt", lines=6, placeholder="Type a prompt or pick an example below",
                                        elem_id="prompt")
                    gr.Examples(ui.EXAMPLES, inputs=[prompt], label="Examples: code, explanation, summary, story",
                                cache_examples=False)
                with gr.Column(scale=4):
                    with gr.Row():
                        lane_a = gr.Dropdown(ui.LANE_KINDS, value=d.lane_a, label="Lane A policy", allow_custom_value=True,
                                             info="or type a spec, e.g. heuristic:3")
                        lane_b = gr.Dropdown(ui.LANE_KINDS, value=d.lane_b, label="Lane B policy", allow_custom_value=True,
                                             info="or type a spec, e.g. threshold:0.3:8")
                    with gr.Row():
                        lane_a_assistant = gr.Dropdown(ui.ASSISTANT_CHOICES, value=ui.DEFAULT_ASSISTANT,
                                                       label="Lane A assistant", elem_id="lane-a-assistant",
                                                       info="default, model (as shipped), int8 (torch) or q4_0 (llama.cpp)")
                        lane_b_assistant = gr.Dropdown(ui.ASSISTANT_CHOICES, value=ui.DEFAULT_ASSISTANT,
                                                       label="Lane B assistant", elem_id="lane-b-assistant",
                                                       info="auto lane: the recommended one unless set here")
                    engines = loader.engines()  # one engine per run; a menu only where there is a choice
                    engine = gr.Dropdown([ui.DEFAULT_ENGINE] + [e for e in engines[1:]], value=ui.DEFAULT_ENGINE,
                                         label="Engine", elem_id="engine", visible=len(engines) > 1,
                                         info=f"default: {engines[0] if engines else '?'} (this app's); the other one "
                                              "loads on its first run")
                    look = budgets.max_lookahead  # the sliders end at the operator's limit (disco.limits)
                    # each policy's parameters name the shared slider that fills them (disco.policies metadata)
                    k = gr.Slider(1, look, value=min(d.k, look), step=1,
                                  label=ui.slider_label("k", "Static lookahead"), elem_id="k")
                    threshold = gr.Slider(0, 1, value=d.threshold, step=0.05,
                                          label=ui.slider_label("threshold", "Threshold"), elem_id="threshold")
                    max_lookahead = gr.Slider(1, look, value=min(d.max_lookahead, look), step=1,
                                              label=ui.slider_label("kmax", "Maximum lookahead"), elem_id="max-lookahead")
                    with gr.Row():
                        most = budgets.max_new_tokens
                        max_new_tokens = gr.Slider(1, most, value=min(d.max_new_tokens, most), step=1,
                                                   label="Max new tokens", elem_id="max-new-tokens", scale=3)
                        with gr.Column(min_width=160, scale=2):
                            baseline = gr.Checkbox(value=d.baseline, label="Autoregressive baseline")
                            chat = gr.Checkbox(value=d.chat, label="Chat template")
                    with gr.Accordion("Sampling", open=False):
                        sample = gr.Checkbox(value=d.sample, label="Sample instead of greedy decoding")
                        with gr.Row():
                            temperature = gr.Slider(0.05, 2, value=d.temperature, step=0.05, label="Temperature")
                            top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="Top-p")
                            seed = gr.Number(value=d.seed, precision=0, label="Seed", minimum=0)
                    with gr.Row():
                        run = gr.Button("▶ Run", variant="primary", elem_id="run")
                        stop = gr.Button(STOP_LABEL, variant="stop", elem_id="stop")
            run_status = gr.Markdown(f"Ready: press **Run**. <small>This app's {budgets.words()} "
                                     "(runs take turns; a queued run shows its position).</small>",
                                     elem_id="run-status", min_height=48)
            lanes = gr.HTML(ui.empty_lanes_html(), css_template=LANES_CSS, js_on_load=None, elem_id="lanes")
            with gr.Row():
                race_plot = gr.Plot(plots.empty_figure(plots.RACE_TITLE), show_label=False, elem_id="plot-race")
                lookahead_plot = gr.Plot(plots.empty_figure(plots.LOOKAHEAD_TITLE), show_label=False, elem_id="plot-lookahead")
            with gr.Row():
                latency_plot = gr.Plot(plots.empty_figure(plots.LATENCY_TITLE), show_label=False, elem_id="plot-latency")
                confidence_plot = gr.Plot(plots.empty_figure(plots.CONFIDENCE_TITLE), show_label=False, elem_id="plot-confidence")
            positions_plot = gr.Plot(plots.empty_figure(plots.POSITIONS_TITLE), show_label=False, elem_id="plot-positions")
            summary = gr.Dataframe(summary_frame([]), label="Summary", interactive=False, elem_id="summary")
            with gr.Row():
                iterations_csv = gr.File(label="Download CSV: per-iteration trace", elem_id="iterations-csv")
                tokens_csv = gr.File(label="Download CSV: per-token trace", elem_id="tokens-csv")
                positions_csv = gr.File(label="Download CSV: acceptance by draft position", elem_id="positions-csv")
            race_batch.build(iterations_csv, measured=lambda: _measured(loader.get_profile()))
        with gr.Tab("Sweep"):
            build_sweep_tab(loader.get, gate)
        with gr.Tab("This machine"):
            machine_md = gr.Markdown("○ waiting for the models…", elem_id="machine")
            with gr.Row():
                machine_cost = gr.Plot(plots.empty_figure(plots.MACHINE_COST_TITLE, "waiting for the models…"),
                                       show_label=False, elem_id="plot-machine-cost")
                machine_speedup = gr.Plot(plots.empty_figure(plots.MACHINE_SPEEDUP_TITLE, "waiting for the models…"),
                                          show_label=False, elem_id="plot-machine-speedup")
        with gr.Tab("About"):
            gr.Markdown(about.about_md(), latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                                       {"left": "$", "right": "$", "display": False}])

        inputs = [prompt, lane_a, lane_b, k, threshold, max_lookahead, max_new_tokens, baseline, chat, sample,
                  temperature, top_p, seed, lane_a_assistant, lane_b_assistant, engine]
        outputs = [run_status, lanes, race_plot, lookahead_plot, latency_plot, confidence_plot, positions_plot, summary,
                   iterations_csv, tokens_csv, positions_csv]
        # Stop ends the race at its next transformer layer, dropping the unfinished iteration; the race itself
        # then shows "Stopped" with the partial trace (see disco.app.session.StopSignals)
        # preprocess=False: compare checks every value itself (disco.limits, the engine), so a caller who sends a
        # string for a slider gets our one-line message, not Gradio's multi-line preprocessing report
        stops.wire(run, stop, compare, inputs, outputs, api_name="compare", concurrency_id="compute",
                   concurrency_limit=1, show_progress="full", show_progress_on=[run_status], preprocess=False,
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
