"""The app's controls declared once (issue 32 item 3): the typed request, the API signature and the event's inputs
all come from one list, by name."""

from __future__ import annotations

import inspect

import gradio as gr
import pytest

from disco.app.controls import Control, Controls
from disco.app.race_inputs import RACE_CONTROLS, RaceRequest
from disco.app.sweep_controls import SWEEP_CONTROLS
from disco.errors import InputError, UserError
from disco.limits import as_int


def _controls():
    return Controls("Req", [
        Control("text", gr.Textbox, "", lambda v: "" if v is None else str(v), {"label": "Text"}, required=True),
        Control("n", gr.Slider, 3, lambda v: as_int(v, "n"), {"minimum": 1, "maximum": 9}),
    ])


def test_parse_checks_every_value_and_fills_defaults():
    req = _controls().parse({"text": "hi"})
    assert (req.text, req.n) == ("hi", 3)
    assert _controls().parse(text="x", n="7").n == 7  # raw text from an API caller, typed by its check
    with pytest.raises(InputError, match="n must be a number, got \\[1\\]"):
        _controls().parse(text="x", n=[1])
    with pytest.raises(InputError, match="unknown input 'bogus'"):
        _controls().parse(text="x", bogus=1)


def test_two_controls_cannot_share_a_name():
    with pytest.raises(ValueError, match="share a name"):
        Controls("Bad", [Control("a", gr.Textbox, "", str), Control("a", gr.Textbox, "", str)])


def test_handler_has_the_controls_signature_and_passes_values_by_name():
    seen = {}

    def fn(raw, request=None):
        seen.update(raw=raw, request=request)
        return "ok"

    event = _controls().handler(fn, "run")
    params = inspect.signature(event).parameters
    assert list(params) == ["text", "n", "request"] and event.__name__ == "run"
    assert params["text"].default is inspect.Parameter.empty and params["n"].default == 3
    assert event("a", 5, request="R") == "ok" and seen == {"raw": {"text": "a", "n": 5}, "request": "R"}
    assert event(text="b") == "ok" and seen["raw"] == {"text": "b"}  # missing: the request's default, when parsed


def test_a_generator_handler_streams():
    def fn(raw, request=None, progress=None):
        yield from (raw["text"], progress)

    event = _controls().handler(fn, "stream", progress=True)
    assert inspect.isgeneratorfunction(event)
    assert "progress" in inspect.signature(event).parameters
    assert list(event("a", 1, progress="P")) == ["a", "P"]


def test_inputs_come_by_name_in_the_declared_order():
    controls = _controls()
    assert controls.inputs({"n": "N", "text": "T"}) == ["T", "N"]
    with pytest.raises(KeyError, match="no widget for n"):
        controls.inputs({"text": "T"})


def test_the_race_and_sweep_keep_their_api_names():
    assert RACE_CONTROLS.names == [
        "prompt", "lane_a", "lane_b", "k", "threshold", "max_lookahead", "max_new_tokens", "baseline", "chat", "sample",
        "temperature", "top_p", "seed", "lane_a_assistant", "lane_b_assistant", "engine"]
    assert SWEEP_CONTROLS.names == [
        "prompt_ids", "static_text", "tau_text", "kmax_text", "use_heuristic", "use_oracle", "max_new", "profile_menu",
        "profile_csv", "rule_choice", "suite_menu", "suite_file", "sample_n", "sample_seed"]


def test_race_request_types_raw_values():
    req = RACE_CONTROLS.parse(prompt="p", k="4", threshold="0.3", sample="false", seed=None)
    assert isinstance(req, RaceRequest)
    assert (req.k, req.threshold, req.sample, req.seed) == (4, 0.3, False, 0)  # bool("false") would be True
    with pytest.raises(UserError, match="the sampling toggle must be true or false"):
        RACE_CONTROLS.parse(prompt="p", sample="maybe")
