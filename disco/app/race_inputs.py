"""The Race tab's controls, declared once (``disco.app.controls``): the page's widgets, the ``/compare`` API's
parameters (this order) and ``RaceRequest``, the typed request ``disco.app.race_tab.compare`` runs, all come from
``RACE_CONTROLS``. Each check takes a raw value (Gradio's preprocessing is off) and refuses a wrong type in one line;
what a value means (a policy spec, a budget) is checked where it is used."""

from __future__ import annotations

import gradio as gr

from disco import limits
from disco.app.controls import Control, Controls
from disco.policies import AUTOREGRESSIVE, policy_kinds

# the lanes' policy menus: every kind the engine knows except the baseline (which has its own toggle), and
# ``auto``: this machine's recommended setting, from the cost profile measured in the background
AUTO = "auto"
LANE_KINDS = [cls.kind for cls in policy_kinds() if cls.kind != AUTOREGRESSIVE] + [AUTO]
# a lane's assistant: the app's default (DISCO_ASSISTANT_PRECISION, calibrated when auto), or one explicitly
DEFAULT_ASSISTANT = "default"
ASSISTANT_CHOICES = [DEFAULT_ASSISTANT, "model", "int8", "q4_0"]  # int8: torch's; q4_0: llama.cpp's (the pair checks)
# what runs the models: the app's own (DISCO_ENGINE, auto), or the other engine where both are installed
DEFAULT_ENGINE = "default"
ENGINE_CHOICES = [DEFAULT_ENGINE, "llamacpp", "torch"]
# the sliders' words in a message, by the slider a policy parameter names (``Param.slider``)
SLIDER_WHAT = {"k": "static lookahead K", "threshold": "threshold", "kmax": "maximum lookahead"}


def _text(what: str):
    return lambda value: limits.as_text(value, what)


def _int(what: str):
    return lambda value: limits.as_int(value, what)


def _float(what: str):
    return lambda value: limits.as_float(value, what)


def _flag(what: str):
    return lambda value: limits.as_flag(value, what)


def _slider_label(slider: str, title: str) -> str:
    """A shared slider's label naming what it fills in each kind, e.g. "Threshold: TAU of threshold; H of cumulative"
    (from the policies' metadata)."""
    by_token: dict[str, list[str]] = {}
    for cls in policy_kinds():
        for p in cls.params:
            if p.slider == slider:
                by_token.setdefault(p.token, []).append(cls.kind)
    parts = [f"{token} of {', '.join(kinds)}" for token, kinds in by_token.items()]
    return f"{title}: {'; '.join(parts)}" if parts else title


RACE_CONTROLS = Controls("RaceRequest", [
    Control("prompt", gr.Textbox, "", _text("the prompt"),
            {"label": "Prompt", "lines": 6, "placeholder": "Type a prompt or pick an example below", "elem_id": "prompt"},
            required=True),
    Control("lane_a", gr.Dropdown, "static", _text("a lane's policy"),
            {"choices": LANE_KINDS, "label": "Lane A policy", "allow_custom_value": True,
             "info": "or type a spec, e.g. heuristic:3"}),
    Control("lane_b", gr.Dropdown, "threshold", _text("a lane's policy"),
            {"choices": LANE_KINDS, "label": "Lane B policy", "allow_custom_value": True,
             "info": "or type a spec, e.g. threshold:0.3:8"}),
    Control("k", gr.Slider, 5, _int(SLIDER_WHAT["k"]),
            {"minimum": 1, "step": 1, "label": _slider_label("k", "Static lookahead"), "elem_id": "k"}),
    Control("threshold", gr.Slider, 0.4, _float(SLIDER_WHAT["threshold"]),
            {"minimum": 0, "maximum": 1, "step": 0.05, "label": _slider_label("threshold", "Threshold"),
             "elem_id": "threshold"}),
    Control("max_lookahead", gr.Slider, 20, _int(SLIDER_WHAT["kmax"]),
            {"minimum": 1, "step": 1, "label": _slider_label("kmax", "Maximum lookahead"), "elem_id": "max-lookahead"}),
    Control("max_new_tokens", gr.Slider, 64, _int("max new tokens"),
            {"minimum": 1, "step": 1, "label": "Max new tokens", "elem_id": "max-new-tokens", "scale": 3}),
    Control("baseline", gr.Checkbox, True, _flag("the baseline toggle"), {"label": "Autoregressive baseline"}),
    Control("chat", gr.Checkbox, True, _flag("the chat template toggle"), {"label": "Chat template"}),
    Control("sample", gr.Checkbox, False, _flag("the sampling toggle"),
            {"label": "Sample instead of greedy decoding"}),
    Control("temperature", gr.Slider, 0.7, _float("temperature"),
            {"minimum": 0.05, "maximum": 2, "step": 0.05, "label": "Temperature"}),
    Control("top_p", gr.Slider, 0.9, _float("top-p"), {"minimum": 0.05, "maximum": 1, "step": 0.05, "label": "Top-p"}),
    Control("seed", gr.Number, 0, limits.check_seed, {"precision": 0, "label": "Seed", "minimum": 0}),
    Control("lane_a_assistant", gr.Dropdown, DEFAULT_ASSISTANT, _text("a lane's assistant"),
            {"choices": ASSISTANT_CHOICES, "label": "Lane A assistant", "elem_id": "lane-a-assistant",
             "info": "default, model (as shipped), int8 (torch) or q4_0 (llama.cpp)"}),
    Control("lane_b_assistant", gr.Dropdown, DEFAULT_ASSISTANT, _text("a lane's assistant"),
            {"choices": ASSISTANT_CHOICES, "label": "Lane B assistant", "elem_id": "lane-b-assistant",
             "info": "auto lane: the recommended one unless set here"}),
    Control("engine", gr.Dropdown, DEFAULT_ENGINE, _text("the engine"), {"label": "Engine", "elem_id": "engine"}),
])
RaceRequest = RACE_CONTROLS.request
DEFAULTS = RaceRequest()  # every control at its default
