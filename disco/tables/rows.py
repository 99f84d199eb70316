"""What a table phase did with each prompt, one row per prompt (a benchmark's ``prompts.csv``): its tokens, whether
the length rule cut or skipped it and why, where its table was built and how long that took. Read from the tables
and the encoder; a table built elsewhere in this run (a Ray worker) names its builder (``BUILD_KEYS``: the phase's
record of it, ``TablePhase.built``)."""

from __future__ import annotations

import pandas as pd

from disco.suites import SuitePrompt

PROMPT_COLUMNS = ["prompt_id", "question", "turn", "kind", "split", "chars", "prompt_tokens", "status", "cut_tokens",
                  "reason", "built_by", "reference_seconds", "chain_seconds", "chain_passes"]
# what a table built elsewhere brings to its row: the builder's own times, and a question's time on its worker and
# from sending it to storing its files
BUILD_KEYS = ("reference_seconds", "chain_seconds", "chain_passes", "unit_seconds", "round_trip_seconds")


def _prompt(p: SuitePrompt) -> dict:
    return {"prompt_id": p.id, "question": p.unit, "turn": p.turn, "kind": p.kind, "split": p.split,
            "chars": len(p.prompt)}


def prompt_row(p: SuitePrompt, encoder, **extra) -> dict:
    """A prompt as the encoder left it (used, cut or skipped), with ``extra`` (where its table came from)."""
    encoded = encoder.encoded.get(p.id)
    skipped = encoder.skipped.get(p.id)
    status = "skipped" if skipped else ("cut" if encoded is not None and encoded.cut else "used")
    return {**_prompt(p), "prompt_tokens": len(encoded.ids) if encoded is not None else None,
            "status": status, "cut_tokens": encoded.cut if encoded is not None else 0, "reason": skipped or "",
            **extra}


def table_row(p: SuitePrompt, table, **extra) -> dict:
    """A prompt whose table came from the cache without the models (what the table says of it)."""
    about = table.meta.get("prompt") or {}
    return {**_prompt(p), "prompt_tokens": len(table.prompt_ids), "status": "cut" if about.get("cut") else "used",
            "cut_tokens": about.get("cut", 0), "reason": "", **extra}


def built_by(table, record: dict | None, **timing) -> dict:
    """Where a table came from: built ``here`` (its ``stats``: this process's build work), built elsewhere in this run
    (``record``: the phase's record of it), or found in the ``cache``."""
    if table.stats:
        return {"built_by": "here", **timing, **table.stats}
    if record is not None:
        return {"built_by": record["built_by"], **timing, **{k: record.get(k) for k in BUILD_KEYS}}
    return {"built_by": "cache", **timing}


def prompts_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in PROMPT_COLUMNS:
        if column not in frame:
            frame[column] = None
    return frame[PROMPT_COLUMNS + [c for c in frame.columns if c not in PROMPT_COLUMNS]]
