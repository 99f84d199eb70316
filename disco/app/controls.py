"""The app's controls, each declared once (issue 32): name, widget, default, the widget's own settings and the check
that turns a raw value into what the handler uses.

From one ``Controls`` list come the page's widgets (``make``), the event's inputs in order (``inputs``: by name, so
no handler indexes a list of positions), the API's signature (``handler``: Gradio reads its parameter names and
defaults, so ``/compare`` and ``/sweep`` keep theirs) and the handler's typed request (``request_type``: a frozen
dataclass with one field per control, built by ``parse`` through every check). Events run with Gradio's
preprocessing off, so a caller who sends a list for a number gets the check's one line, not Gradio's report.

The race's list is ``disco.app.race_inputs.RACE_CONTROLS``, the Sweep's ``disco.app.sweep_controls.SWEEP_CONTROLS``.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import gradio as gr

from disco.errors import InputError


@dataclass(frozen=True)
class Control:
    name: str                       # the API's parameter and the request's field
    widget: Callable[..., Any]      # gr.Slider, gr.Checkbox, ...
    default: Any
    check: Callable[[Any], Any]     # raw value -> the handler's value; a UserError (one line) for anything else
    options: Mapping[str, Any] = field(default_factory=dict)  # the widget's own arguments (label, range, elem_id ...)
    required: bool = False          # the API asks for it (no default in its signature)

    def make(self, **overrides):
        """This control's widget; ``overrides`` for what only the page knows (a limit's range, a suite's choices)."""
        # a required control's widget starts empty (the API would read a starting value as a default)
        kwargs = {"value": None if self.required else self.default, **self.options, **overrides}
        return self.widget(**kwargs)


class Controls:
    """An ordered list of controls: the API's order is the declaration's."""

    def __init__(self, name: str, controls: Iterable[Control]):
        self.controls = tuple(controls)
        self.by_name = {c.name: c for c in self.controls}
        if len(self.by_name) != len(self.controls):
            raise ValueError(f"{name}: two controls share a name")
        self.request = dataclasses.make_dataclass(
            name, [(c.name, Any, field(default=c.default)) for c in self.controls], frozen=True)

    def __getitem__(self, name: str) -> Control:
        return self.by_name[name]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.controls]

    def parse(self, values: Mapping[str, Any] | None = None, **more) -> Any:
        """The typed request from raw values (missing ones take their defaults), every control's check applied."""
        raw = {**(values or {}), **more}
        unknown = sorted(set(raw) - set(self.by_name))
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}: this endpoint takes {', '.join(self.names)}")
        return self.request(**{c.name: c.check(raw.get(c.name, c.default)) for c in self.controls})

    def inputs(self, widgets: Mapping[str, Any]) -> list:
        """The event's inputs, in the declared order, from the widgets the layout made (by name)."""
        missing = [n for n in self.names if n not in widgets]
        if missing:
            raise KeyError(f"the page made no widget for {', '.join(missing)}")
        return [widgets[n] for n in self.names]

    def handler(self, fn: Callable, name: str, *, progress: bool = False) -> Callable:
        """A Gradio event function taking the controls' raw values (its signature: the controls' names and
        defaults, then ``request``) and calling ``fn(raw_values, request=..., [progress=...])``; ``fn`` parses them
        itself so that its own error handling sees a bad value."""
        def event(*args, **kwargs):
            values = event.__signature__.bind(*args, **kwargs).arguments  # positional or by name, as Gradio passes
            raw = {n: values[n] for n in self.names if n in values}
            extra = {"progress": values.get("progress")} if progress else {}
            return fn(raw, request=values.get("request"), **extra)

        params = [inspect.Parameter(c.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if c.required else c.default)
                  for c in self.controls]
        if progress:
            params.append(inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()))
        params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=gr.Request))
        event.__signature__ = inspect.Signature(params)
        event.__annotations__ = {"request": gr.Request}
        event.__name__ = event.__qualname__ = name
        if inspect.isgeneratorfunction(fn):  # Gradio streams what a generator function yields
            def streaming(*args, **kwargs):
                yield from event(*args, **kwargs)
            streaming.__signature__, streaming.__annotations__ = event.__signature__, event.__annotations__
            streaming.__name__ = streaming.__qualname__ = name
            return streaming
        return event
