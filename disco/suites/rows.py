"""Rows of any table (a JSONL or CSV file, a hub dataset) as prompts.

The prompt is one column (``--prompt-field``, default ``prompt``) or a template over columns (``--prompt-template
'Summarize:\\n{article}'``: ``\\n`` and ``\\t`` are newline and tab; ``{{`` is a brace; only plain column names, no
attribute or index access, so a template cannot reach into Python objects). The id and kind come from columns
(``--id-field`` / ``id``, ``--kind-field`` / ``kind``) or from the row's place and the source's name; ``chat`` from
``--chat/--no-chat``, else a ``chat`` column, else the source's default. A row whose prompt is empty, not text or over
``disco.limits.PROMPT_MAX_CHARS`` is dropped and counted (``Suite.dropped``), never silently lost.
"""

from __future__ import annotations

import string
from typing import Iterable

from disco.errors import BenchError
from disco.limits import PROMPT_MAX_CHARS
from disco.suites.record import Suite, SuiteOptions, SuitePrompt

TRUE = {"1", "true", "yes", "y", "on"}
FALSE = {"0", "false", "no", "n", "off", ""}


def unescape(template: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` typed on a command line become a newline, a tab and a backslash."""
    out, i = [], 0
    while i < len(template):
        ch = template[i]
        if ch == "\\" and i + 1 < len(template) and template[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[template[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def template_parts(template: str) -> list[tuple[str, str | None]]:
    """(literal text, column or None) pieces of a template; a clear error for anything but plain column names."""
    try:
        parsed = list(string.Formatter().parse(unescape(template)))
    except ValueError as exc:
        raise BenchError(f"prompt template {template[:60]!r}: {exc} (write a literal brace as {{{{ or }}}})") from None
    parts = []
    for literal, name, spec, conversion in parsed:
        if name is not None:
            if not name or not name.replace("_", "").replace("-", "").replace(" ", "").isalnum():
                raise BenchError(f"prompt template: {{{name}}} is not a column name (plain names only, e.g. {{article}})")
            if spec or conversion:
                raise BenchError(f"prompt template: {{{name}}} takes no format spec or conversion")
        parts.append((literal, name))
    if not any(name for _, name in parts):
        raise BenchError(f"prompt template {template[:60]!r} names no column (e.g. 'Summarize:\\n{{article}}')")
    return parts


def _cell(value) -> str | None:
    """A cell as text; None when it is not a scalar (a list or a mapping is no prompt)."""
    if value is None:
        return ""
    if isinstance(value, (list, dict, tuple)):
        return None
    return value if isinstance(value, str) else str(value)


class RowMapping:
    """How one source's rows become prompts, checked once against its columns."""

    def __init__(self, columns: Iterable[str], options: SuiteOptions, source: str, default_kind: str,
                 default_chat: bool):
        self.columns = list(columns)
        cols = set(self.columns)
        self.source, self.default_kind, self.default_chat, self.options = source, default_kind, default_chat, options
        if options.template and options.prompt_field:
            raise BenchError("give --prompt-field or --prompt-template, not both")
        self.parts = template_parts(options.template) if options.template else None
        if self.parts:
            missing = [name for _, name in self.parts if name and name not in cols]
            if missing:
                raise BenchError(f"{source}: the template names {missing[0]!r}, which is not a column "
                                 f"({self._columns_words()})")
        self.prompt_field = None if self.parts else (options.prompt_field or "prompt")
        if self.prompt_field and self.prompt_field not in cols:
            hint = "" if options.prompt_field else "; give --prompt-field or --prompt-template"
            raise BenchError(f"{source}: no column {self.prompt_field!r} ({self._columns_words()}){hint}")
        for what, name in (("--id-field", options.id_field), ("--kind-field", options.kind_field)):
            if name and name not in cols:
                raise BenchError(f"{source}: {what} {name!r} is not a column ({self._columns_words()})")
        self.id_field = options.id_field or ("id" if "id" in cols else None)
        self.kind_field = options.kind_field or ("kind" if "kind" in cols else None)
        self.chat_field = "chat" if "chat" in cols and options.chat is None else None

    def _columns_words(self) -> str:
        shown = ", ".join(self.columns[:12]) + (", ..." if len(self.columns) > 12 else "")
        return f"columns: {shown}" if self.columns else "it has no columns"

    def text(self, row: dict) -> str | None:
        if self.parts is None:
            return _cell(row.get(self.prompt_field))
        out = []
        for literal, name in self.parts:
            out.append(literal)
            if name:
                value = _cell(row.get(name))
                if value is None:
                    return None
                out.append(value)
        return "".join(out).strip()

    def chat(self, row: dict) -> bool:
        if self.options.chat is not None:
            return self.options.chat
        if self.chat_field:
            value = str(row.get(self.chat_field, "")).strip().lower()
            if value in TRUE:
                return True
            if value in FALSE and value:
                return False
        return self.default_chat


def why_unusable(text: str | None) -> str | None:
    """Why a row's prompt cannot be used (None when it can)."""
    if text is None:
        return "the prompt is not text"
    if not text.strip():
        return "empty prompt"
    if len(text) > PROMPT_MAX_CHARS:
        return f"longer than {PROMPT_MAX_CHARS:,} characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid text (a lone surrogate)"
    return None


def rows_to_suite(rows: Iterable[dict], mapping: RowMapping, name: str, id_prefix: str = "") -> Suite:
    """Every row as a prompt (in order), the unusable ones counted; duplicate ids are an error."""
    prompts, dropped, seen = [], [], set()
    limit = mapping.options.max_prompts
    for i, row in enumerate(rows):
        raw_id = _cell(row.get(mapping.id_field)) if mapping.id_field else None
        pid = (raw_id or "").strip() or f"{id_prefix}{i}"
        text = mapping.text(row)
        why = why_unusable(text)
        if why:
            dropped.append((pid, why))
            continue
        if pid in seen:
            raise BenchError(f"{mapping.source}: duplicate id {pid[:80]!r} (row {i + 1}); give --id-field with unique "
                             "values, or none to number the rows")
        seen.add(pid)
        kind = ((_cell(row.get(mapping.kind_field)) or "") if mapping.kind_field else "").strip() or mapping.default_kind
        prompts.append(SuitePrompt(pid, kind[:80], mapping.chat(row), text))
        if limit is not None and len(prompts) > limit:
            raise BenchError(f"{mapping.source} has more than {limit:,} prompts, this app's limit per suite")
    if not prompts:
        raise BenchError(f"{mapping.source} has no usable prompt"
                         + (f" ({len(dropped)} rows dropped: {dropped[0][1]}, ...)" if dropped else ""))
    how = (f"prompt from template {mapping.options.template!r}" if mapping.parts
           else f"prompt from column {mapping.prompt_field!r}")
    return Suite(name, tuple(prompts), tuple(dropped), (how,))
