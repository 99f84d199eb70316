"""The Race tab's "as in a batch of B": a finished race's lanes re-costed as B identical sequences decoded together
(``disco.replay.recost.recost_trace``), under a cost profile and a verification layout. A prediction, labelled so:
the lanes ran alone; their iterations are the same at any batch size (greedy), only the price of each pass changes."""

from __future__ import annotations

import logging

import gradio as gr
import pandas as pd

from disco.app import sweep_inputs
from disco.costs import model as cost_mod
from disco.costs.batched import check_batch, resolve_batched
from disco.errors import BenchError, UserError, first_line
from disco.replay.layouts import LAYOUTS, Pricer
from disco.replay.recost import recost_trace

log = logging.getLogger("disco.app")
PROFILES = ("flat:0.05", "roofline:h100", "roofline:l4", "roofline:this", cost_mod.MEASURED)
COLUMNS = ["strategy", "batch", "predicted_ms", "tokens_per_s", "speedup"]


def predict(trace_csv, batch, layout, profile, measured=None) -> tuple[str, pd.DataFrame]:
    """(label, one row per lane) for a race's per-iteration CSV; BenchError (one line) for bad input."""
    if not trace_csv:
        raise BenchError("run a race first: its per-iteration trace is what a batch re-costs")
    b = check_batch(batch)
    if str(layout) not in LAYOUTS:
        raise BenchError(f"unknown layout {str(layout)[:40]!r}: choose one of {', '.join(LAYOUTS)}")
    text = str(profile or "").strip()
    if text.lower().endswith(".csv"):  # a typed path would let a caller read files on the server
        raise BenchError("choose flat:C, roofline:DEVICE or measured here")
    name = cost_mod.check_profile(text)
    costs = resolve_batched(name, measured=measured() if callable(measured) else measured)
    frame = pd.read_csv(trace_csv)
    rows = recost_trace(frame, b, Pricer(costs, str(layout)))
    return f"predicted on {costs.label}, {b} identical sequences, layout {layout}", pd.DataFrame(rows, columns=COLUMNS)


def build(iterations_csv: gr.File, measured=None) -> None:
    """The section's widgets and event (call inside the Race tab, after its CSV downloads). ``measured``: a
    no-argument callable giving this machine's batch-1 CostModel (or None)."""
    with gr.Accordion("As in a batch of B (predicted)", open=False):
        with gr.Row():
            batch = gr.Number(16, precision=0, minimum=1, maximum=1024, label="Batch size B", elem_id="race-batch")
            layout = gr.Dropdown(list(LAYOUTS), value="padded-max", label="Verification layout",
                                 elem_id="race-batch-layout")
            profile = gr.Dropdown(list(PROFILES), value="roofline:h100", allow_custom_value=True,
                                  label="Cost profile", elem_id="race-batch-profile")
            go_button = gr.Button("Re-cost the race", elem_id="race-batch-run")
        status = gr.Markdown("", elem_id="race-batch-status")
        table = gr.Dataframe(pd.DataFrame(columns=COLUMNS), interactive=False, elem_id="race-batch-table")

    def run(trace, b, layout_name, profile_name):
        try:
            label, frame = predict(sweep_inputs.uploaded(trace, "trace"), b, layout_name,
                                   sweep_inputs.text(profile_name, "cost profile"), measured)
        except (UserError, ValueError, OSError) as exc:
            if not isinstance(exc, UserError):
                log.exception("re-costing a race as a batch failed")
            return f"⚠ {first_line(exc)}", gr.skip()
        return label, frame.round(3)

    go_button.click(run, [iterations_csv, batch, layout, profile], [status, table], api_name="race_batch",
                    preprocess=False,  # the handler checks every raw value itself (one line, never a 400)
                    queue=False)
