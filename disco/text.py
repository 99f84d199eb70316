"""Numbers for people: one way to print a value that may be missing (tables, status lines, reports)."""

from __future__ import annotations

DASH = "—"


def missing(value) -> bool:
    """None or NaN (a float's, numpy's or pandas' NA)."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except (TypeError, ValueError):  # pandas.NA refuses bool()
        return True


def fmt(value, spec: str = ".2f", dash: str = DASH, suffix: str = "") -> str:
    """``format(value, spec) + suffix``; ``dash`` for a missing value, yes / no for a bool, the value as text when
    ``spec`` does not apply to it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if missing(value):
        return dash
    try:
        return format(value, spec) + suffix
    except (TypeError, ValueError):
        return str(value)


def times(value, spec: str = ".2f", dash: str = DASH) -> str:
    """A speed-up: ``1.23×``."""
    return fmt(value, spec, dash, "×")
