"""The Sweep tab's controls, declared once (``disco.app.controls``): the tab's widgets, the ``/sweep`` API's
parameters (this order, these names: the API's since before the suites were added) and ``SweepRequest``, the typed
request its Run event runs, come from ``SWEEP_CONTROLS``. Each check takes a raw value (``disco.app.sweep_inputs``:
Gradio's preprocessing is off, uploads must be files Gradio received); what a value means (a grid, a budget) is
checked where it is used."""

from __future__ import annotations

import gradio as gr

from disco.app import sweep_inputs as raw, sweep_suites
from disco.app.controls import Control, Controls
from disco.app.sweep_views import RULE_CHOICES
from disco.costs import model as cost_mod
from disco.policies import KMAXES, STATIC_KS, policy_class, policy_kinds
from disco.policies.grids import COARSE_TAUS, rule_kinds

DEFAULT_TAUS = ",".join(format(t, "g") for t in COARSE_TAUS)
DEFAULT_STATIC = ",".join(str(k) for k in STATIC_KS)
DEFAULT_KMAXES = ",".join(str(k) for k in KMAXES)
MAX_SWEEP_TOKENS = 256  # the slider's end


def default_rules() -> list[str]:
    """The rules ticked at first: every one but the hybrids (132 pairs: with them the default grid would pass the app's
    settings limit; ticked, they fit beside the classic kinds)."""
    return [kind for kind in rule_kinds() if not policy_class(kind).composite]


def _check(fn, what: str):
    return lambda value: fn(value, what)


SWEEP_CONTROLS = Controls("SweepRequest", [
    # its choices and ticks are the suite's (the page passes them)
    Control("prompt_ids", gr.CheckboxGroup, None, _check(raw.choices, "prompts"),
            {"label": "Prompts", "elem_id": "sweep-prompts"}),
    Control("static_text", gr.Textbox, DEFAULT_STATIC, _check(raw.text, "static K values"),
            {"label": "Static K values", "elem_id": "sweep-static"}),
    Control("tau_text", gr.Textbox, DEFAULT_TAUS, _check(raw.text, "τ"),
            {"label": "Thresholds τ", "elem_id": "sweep-taus"}),
    Control("kmax_text", gr.Textbox, DEFAULT_KMAXES, _check(raw.text, "KMAX values"),
            {"label": "KMAX values", "elem_id": "sweep-kmaxes"}),
    Control("use_heuristic", gr.Checkbox, True, _check(raw.flag, "heuristic"), {"label": "heuristic:5"}),
    Control("use_oracle", gr.Checkbox, True, _check(raw.flag, "oracle"), {"label": "oracle (upper bound)"}),
    Control("max_new", gr.Slider, 48, _check(raw.as_int, "max new tokens"),
            {"minimum": 8, "maximum": MAX_SWEEP_TOKENS, "step": 8, "label": "Max new tokens",
             "elem_id": "sweep-max-new-tokens"}),
    Control("profile_menu", gr.Dropdown, cost_mod.MEASURED, _check(raw.text, "cost profile"),
            {"choices": list(cost_mod.PRESETS), "allow_custom_value": True, "interactive": True,
             "label": "Cost profile (measured, or flat:C = a GPU-like regime)", "elem_id": "sweep-cost-profile"}),
    Control("profile_csv", gr.File, None, _check(raw.uploaded, "cost CSV"),
            {"label": "…or a per-pass cost CSV (python -m disco profile --csv)", "file_types": [".csv"],
             "type": "filepath", "elem_id": "sweep-cost-csv"}),
    Control("rule_choice", gr.CheckboxGroup, (), _check(raw.choices, "stopping rules"),
            {"choices": RULE_CHOICES, "elem_id": "sweep-rules",
             "label": "More stopping rules (each over its own parameter grid, with these KMAX values)",
             "info": " · ".join(cls.template() for cls in policy_kinds() if cls.kind in RULE_CHOICES)}),
    Control("suite_menu", gr.Dropdown, sweep_suites.BUILTIN, _check(raw.text, "suite"),
            {"choices": sweep_suites.MENU, "label": "Suite", "elem_id": "sweep-suite", "interactive": True}),
    Control("suite_file", gr.File, None, _check(raw.uploaded, "suite file"),
            {"label": "…or upload a suite (.jsonl, .csv, .json)", "file_types": sweep_suites.UPLOAD_TYPES,
             "type": "filepath", "elem_id": "sweep-suite-file"}),
    Control("sample_n", gr.Number, 0, _check(raw.number, "sample size"),
            {"precision": 0, "minimum": 0, "maximum": sweep_suites.SAMPLE_MAX, "elem_id": "sweep-sample",
             "label": "…or a sample of N prompts, stratified by kind (0: the ticked ones)"}),
    Control("sample_seed", gr.Number, 0, _check(raw.number, "sample seed"),
            {"precision": 0, "minimum": 0, "label": "sample seed", "elem_id": "sweep-sample-seed"}),
])
SweepRequest = SWEEP_CONTROLS.request
