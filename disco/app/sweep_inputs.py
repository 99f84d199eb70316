"""The Sweep's raw inputs. Its Run event has Gradio's preprocessing off, as the race's has, so a caller who sends a
value of the wrong type (a list for a text field, an object for a number) gets one line of ours rather than Gradio's
several-line report; each value is checked here and turned into what the tab uses.

Uploaded files arrive as Gradio's file records (``{"path": ..., "meta": {"_type": "gradio.FileData"}}``); only a file
Gradio itself received (in its upload folder) is accepted, never a path a caller names (``/etc/passwd``).
"""

from __future__ import annotations

from pathlib import Path

from disco.errors import BenchError
from disco.limits import as_flag, as_int, as_text

text = as_text  # a text field: None is empty, any other type one line


def flag(value, what: str) -> bool:
    return as_flag(value, what, BenchError)


def choices(value, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise BenchError(f"{what} must be a list of names, got {str(value)[:60]!r}")


def number(value, what: str, default: int = 0) -> int:
    return default if value is None or (isinstance(value, str) and not value.strip()) else as_int(value, what)


def uploaded(value, what: str) -> str | None:
    """The path of a file Gradio received for this app (None when there is none); one line for anything else."""
    if value is None:
        return None
    path = value if isinstance(value, str) else value.get("path") if isinstance(value, dict) else None  # a record, or
    # the path Gradio's own preprocessing made of one (the re-costing event)
    if not isinstance(path, str) or not path:
        raise BenchError(f"{what}: upload a file (got {type(value).__name__})")
    from gradio.processing_utils import get_upload_folder
    from gradio.utils import is_in_or_equal

    try:
        received = is_in_or_equal(path, get_upload_folder()) and Path(path).is_file()
    except (ValueError, OSError):  # a NUL byte, a name too long: no file Gradio wrote
        received = False
    if not received:
        raise BenchError(f"{what}: not a file uploaded to this app")
    return path
