"""One base for every error a user can cause: a one-line message, never a traceback.

Every entry point catches ``UserError`` and nothing narrower: the command line prints ``disco: error: ...`` on
stderr and exits with code 2; the app shows the message as a visible error in the page. Each area raises its own
subclass (``StrategyError`` for a bad policy spec, ``ModelLoadError`` for a pair that cannot be loaded, ...), so a
message says where it comes from, and the subclasses keep the builtin base they always had (``ValueError`` for bad
values, ``RuntimeError`` for a state that cannot be reached) for callers that catch those.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix: the message is one line and says what to do."""


class InputError(UserError, ValueError):
    """Bad user input (empty prompt, impossible lengths, a number out of range, ...)."""


class BenchError(UserError, ValueError):
    """A benchmark or prompt-suite input that cannot be used (a suite file, a selection, a grid, an option)."""


class Interrupted(Exception):
    """A step abandoned at the caller's request (Stop in the app); that decoder cannot step again. Not an error."""


class MissingResult(Exception):
    """A result that could not be had for a reason no input caused and no user can fix (a busy machine: a tool that
    exited before printing its figures). Not a ``UserError``: its caller records the gap as a note and goes on, so it
    never reaches an entry point."""


def first_line(exc: BaseException) -> str:
    """An exception's message as one line (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
