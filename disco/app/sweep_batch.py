"""The Sweep tab's "per batch size" section: the last sweep's prompts and settings replayed as B concurrent sequences
(``disco.bench.batch_sweep``), its answer per B as a table and a plot, every figure labelled with where its costs
come from (measured here, flat:C, a CSV, or a roofline prediction)."""

from __future__ import annotations

import logging

import gradio as gr
import pandas as pd
import plotly.graph_objects as go

from disco import limits
from disco.app import plots, zerogpu
from disco.app.session import COMPUTE_LOCK
from disco.bench.batch_sweep import answer_per_batch
from disco.costs.batched import check_batch
from disco.errors import BenchError, UserError, first_line
from disco.replay.layouts import LAYOUTS

log = logging.getLogger("disco.app")
DEFAULT_BATCHES = "1,2,4,8,16"
MAX_BATCHES = 8
SHOWN = ["batch", "best_static", "best_static_speedup", "best_threshold", "best_threshold_speedup",
         "reference_speedup", "reference_share_of_static", "batchstop_speedup", "speculation_pays"]


def parse_batches(text) -> list[int]:
    values = [x for x in str(text or "").replace(" ", ",").split(",") if x.strip()]
    if not values:
        raise BenchError("give at least one batch size, e.g. 1,2,4,8")
    if len(values) > MAX_BATCHES:
        raise BenchError(f"at most {MAX_BATCHES} batch sizes at once")
    try:
        return sorted({check_batch(v) for v in values})
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def figure(ans: pd.DataFrame, label: str) -> go.Figure:
    """Speed-up against batch size: the best static K, the best threshold, τ 0.4 / 20 and the batch-level stop."""
    fig = go.Figure()
    for column, name in (("best_static_speedup", "best static K"), ("best_threshold_speedup", "best threshold"),
                         ("reference_speedup", "threshold:0.4:20"), ("batchstop_speedup", "batch-level stop")):
        fig.add_trace(go.Scatter(x=ans["batch"], y=ans[column], mode="lines+markers", name=name))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(title=f"Speed-up per batch size ({label})", xaxis_title="batch size B (concurrent sequences)",
                      yaxis_title="throughput / target alone", xaxis_type="log", height=380,
                      margin=dict(l=50, r=20, t=60, b=40))
    return fig


def build(state: gr.State, get_pair, gate=None) -> None:
    """The section's widgets and its one event (call inside the Sweep tab, after its own widgets)."""
    gr.Markdown("### Per batch size\nReplay the last sweep's prompts and settings as B sequences decoded together "
                "(continuous batching; greedy acceptance does not change with batching, so the cached tables hold "
                "every answer). Speed-up is throughput over the target alone's at the same B.")
    with gr.Row():
        batches = gr.Textbox(DEFAULT_BATCHES, label="Batch sizes", elem_id="sweep-batches")
        layout = gr.Dropdown(list(LAYOUTS), value="padded-max", label="Verification layout", elem_id="sweep-layout",
                             info="padded-k: every row padded to K+1 (CUDA graphs) · padded-max: to the longest draft "
                                  "· graph: total rounded to a captured size · ragged: no padding · llama-split: "
                                  "llama.cpp's one KV stream per sequence")
        go_button = gr.Button("Answer per batch size", elem_id="sweep-batch-run")
    status = gr.Markdown("", elem_id="sweep-batch-status")
    plot = gr.Plot(plots.empty_figure("Speed-up per batch size", "run a sweep, then press Answer per batch size"),
                   show_label=False, elem_id="sweep-batch-plot")
    table = gr.Dataframe(pd.DataFrame(columns=SHOWN), interactive=False, elem_id="sweep-batch-table",
                         label="Per batch size (settings chosen on the train prompts, speed-ups on the test prompts)")

    def per_batch(batch_text, layout_name, st):
        try:
            if not st or not st.get("records"):
                raise BenchError("run a sweep first: its prompts and settings are what a batch replays")
            sizes = parse_batches(batch_text)
            if str(layout_name) not in LAYOUTS:
                raise BenchError(f"unknown layout {str(layout_name)[:40]!r}: choose one of {', '.join(LAYOUTS)}")
            pair = get_pair() if callable(get_pair) else get_pair
            with COMPUTE_LOCK:
                _, ans, label = answer_per_batch(pair, list(st["records"].values()), list(st.get("specs", [])),
                                                 int(st.get("max_new_tokens", 48)), st.get("cost_profile"), sizes,
                                                 str(layout_name))
        except (UserError, ValueError, RuntimeError) as exc:
            if not isinstance(exc, UserError):
                log.exception("the per-batch answer failed")
            return f"⚠ {first_line(exc)}", gr.skip(), gr.skip()
        return (f"Costs: **{label}** · layout `{layout_name}` · {len(st['records'])} prompts.",
                figure(ans, label), ans[SHOWN].round(3))

    per_batch = zerogpu.gpu(per_batch, limits.Budgets.from_env().run_s)
    inputs = [batches, layout, state]
    extra = {"validator": gate.validator_for(per_batch, len(inputs))} if gate is not None else {}
    # preprocess=False: the handler checks every raw value itself, so a bad one gets our one line, not a 400
    go_button.click(per_batch, inputs, [status, plot, table], api_name="sweep_batch", concurrency_id="compute",
                    preprocess=False,
                    **extra)
