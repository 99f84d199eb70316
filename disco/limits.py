"""Input checks and operator budgets shared by the command line and the app (one place, same messages).

Every check raises ``InputError`` (a ``ValueError``) with one line for the user. The budgets bound what one
caller can make the single compute queue do on a hosted app; an operator sets them with environment variables
(docs/hosting.md):

``DISCO_RUN_BUDGET_S``       wall-clock seconds one race or sweep may run (default 240; 0 = no budget). A run
                             that reaches it ends like Stop, keeping what it completed, and says why.
``DISCO_MAX_LOOKAHEAD``      largest K / KMAX a lane spec may ask for in the app (default 32, the sliders' end).
``DISCO_MAX_NEW_TOKENS``     most new tokens per race in the app (default 512, the slider's end).
``DISCO_SWEEP_MAX_SETTINGS`` most settings one sweep may replay (default 200).
``DISCO_SWEEP_MAX_WORK``     most settings x prompts x new tokens one sweep may ask for (default 400000; the
                             default grid on every suite prompt at 64 tokens is about 70000).

The command line is a local tool: it uses the engine's own ranges for lookahead and new tokens, and the same
prompt and seed checks as the app.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from disco.errors import InputError

SEED_MAX = 2**63 - 1
PROMPT_MAX_CHARS = 100_000  # far above any model context here; refuses a pasted file before tokenizing it


def env_int(name: str, default, lo: int, hi: int):
    """An operator's whole number from ``lo`` to ``hi`` in the environment (``default`` when unset); anything else is
    refused in one line naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise InputError(f"{name}={raw!r}: expected a whole number from {lo} to {hi}")
    return value


def env_number(name: str, default: float, cast=float, lo: float = 0.0) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        number = float(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r}: expected a number") from None
    if not math.isfinite(number) or number < lo:  # checked before the cast: int(inf) would raise OverflowError
        raise InputError(f"{name}={raw!r}: expected a number >= {lo:g}")
    return cast(number)


@dataclass(frozen=True)
class Budgets:
    run_s: float = 240.0
    max_lookahead: int = 32
    max_new_tokens: int = 512
    sweep_settings: int = 200
    sweep_work: int = 400_000

    @classmethod
    def from_env(cls) -> "Budgets":
        d = cls()
        return cls(run_s=env_number("DISCO_RUN_BUDGET_S", d.run_s),
                   max_lookahead=int(env_number("DISCO_MAX_LOOKAHEAD", d.max_lookahead, int, 1)),
                   max_new_tokens=int(env_number("DISCO_MAX_NEW_TOKENS", d.max_new_tokens, int, 1)),
                   sweep_settings=int(env_number("DISCO_SWEEP_MAX_SETTINGS", d.sweep_settings, int, 1)),
                   sweep_work=int(env_number("DISCO_SWEEP_MAX_WORK", d.sweep_work, int, 1)))

    def words(self) -> str:
        run = f"{self.run_s:g} s per run" if self.run_s > 0 else "no time limit"
        return f"budget: {run}, lookahead ≤ {self.max_lookahead}, ≤ {self.max_new_tokens} new tokens"


# ---------------------------------------------------------------------------------------------
# values


def as_int(value, what: str) -> int:
    """A whole number from an int, an integral float or its text; exact for large integers (no float detour)."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip() if value is not None else ""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise InputError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number != math.floor(number):
        raise InputError(f"{what} must be a whole number, got {value!r}")
    return int(number)


def upload_limit() -> int:
    """The largest file a visitor may upload, in bytes (``DISCO_MAX_UPLOAD_MB``, default 8: a suite or a cost CSV);
    Gradio refuses bigger ones before they reach the app."""
    return int(env_number("DISCO_MAX_UPLOAD_MB", 8, float, 0.001) * 1024 * 1024)


def as_text(value, what: str) -> str:
    """A text input as given (None: empty); anything else (a number, a list, an object) is refused in one line."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{what} must be text, got {type(value).__name__}")
    return value


FLAG_TRUE, FLAG_FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off", ""}


def as_flag(value, what: str, error: type[Exception] = InputError) -> bool:
    """A checkbox's value: a bool, 0 / 1, or true / false / yes / no / on / off as text; one line (``error``) for
    anything else (``bool("false")`` would be True)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in FLAG_TRUE | FLAG_FALSE:
        return value.strip().lower() in FLAG_TRUE
    raise error(f"{what} must be true or false, got {str(value)[:40]!r}")


def as_float(value, what: str) -> float:
    if isinstance(value, bool):
        raise InputError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InputError(f"{what} must be a finite number, got {value!r}")
    return number


def check_seed(value) -> int:
    seed = 0 if value is None or (isinstance(value, str) and not value.strip()) else as_int(value, "seed")
    if not 0 <= seed <= SEED_MAX:
        raise InputError(f"seed must be between 0 and 2**63 - 1, got {seed}")
    return seed


def check_prompt(text) -> str:
    """The prompt as given, if it is non-empty text that can be encoded (no lone surrogates, no invalid bytes)."""
    if not isinstance(text, str):
        raise InputError(f"the prompt must be text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"the prompt is not valid text: character {exc.start} is a lone surrogate or an "
                         "undecodable byte (invalid UTF-8?)") from None
    if not text.strip():
        raise InputError("the prompt is empty: type one or pick an example")
    if len(text) > PROMPT_MAX_CHARS:
        raise InputError(f"the prompt has {len(text):,} characters; at most {PROMPT_MAX_CHARS:,}")
    return text


def check_lookahead(policies, limit: int) -> None:
    """Hold every lane's K / KMAX to ``limit`` (the app's sliders end there)."""
    for policy in policies:
        k = getattr(policy, "k", None)
        if policy.drafts and k is not None and k > limit:
            raise InputError(f"{policy.spec}: lookahead {k} is over this app's limit of {limit} "
                             "(DISCO_MAX_LOOKAHEAD)")


def check_sweep(settings: int, prompts: int, max_new_tokens: int, budgets: Budgets) -> None:
    if settings > budgets.sweep_settings:
        raise InputError(f"the grid has {settings} settings; this app replays at most {budgets.sweep_settings} "
                         "per sweep (DISCO_SWEEP_MAX_SETTINGS): use fewer τ, KMAX or K values")
    work = settings * prompts * max_new_tokens
    if work > budgets.sweep_work:
        raise InputError(f"{settings} settings × {prompts} prompts × {max_new_tokens} tokens = {work:,} is over this "
                         f"app's sweep limit of {budgets.sweep_work:,} (DISCO_SWEEP_MAX_WORK): use fewer prompts, "
                         "settings or tokens")
    check_new_tokens(max_new_tokens, budgets)


def check_new_tokens(max_new_tokens: int, budgets: Budgets) -> None:
    if max_new_tokens > budgets.max_new_tokens:
        raise InputError(f"max new tokens {max_new_tokens} is over this app's limit of {budgets.max_new_tokens} "
                         "(DISCO_MAX_NEW_TOKENS)")


# ---------------------------------------------------------------------------------------------
# time budget


class Deadline:
    """A run's time budget as a stop check: ``expired()`` turns true ``seconds`` after creation (never for 0)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = float(seconds)
        self._clock = clock
        self._end = clock() + self.seconds if self.seconds > 0 else math.inf
        self.hit = False
        self._user_stop: Callable[[], bool] | None = None

    def expired(self) -> bool:
        if self._clock() >= self._end:
            self.hit = True
        return self.hit

    def stop_check(self, should_stop: Callable[[], bool] | None) -> Callable[[], bool]:
        """``should_stop`` or the budget, whichever comes first (the budget is checked even with no Stop)."""
        self._user_stop = should_stop
        if should_stop is None:
            return self.expired
        return lambda: self.expired() or should_stop()

    def ended_the_run(self) -> bool:
        """True when the budget, not the caller's own Stop, is why the run ended."""
        return self.hit and not (self._user_stop is not None and self._user_stop())

    def reason(self) -> str:
        return (f"this app's time budget of {self.seconds:g} s per run was reached (DISCO_RUN_BUDGET_S); "
                "what completed is kept")
