"""The About tab's text: ``about.md`` beside this file, with the table of policies filled in from each kind's metadata
(``disco.policies``), so a new stopping rule appears there without editing the text."""

from __future__ import annotations

from pathlib import Path

from disco.policies import policy_kinds

ABOUT_PATH = Path(__file__).with_name("about.md")


def policy_table_md() -> str:
    """The About tab's table of policies, read from each kind's metadata (disco.policies)."""
    rows = ["| policy | spec | what it does | from |", "|---|---|---|---|"]
    for cls in policy_kinds():
        rows.append(f"| {cls.kind} | `{cls.template()}` | {cls.summary} | {cls.cite or '—'} |")
    return "\n".join(rows)


def about_md() -> str:
    return ABOUT_PATH.read_text(encoding="utf-8").replace("{POLICY_TABLE}", policy_table_md())
