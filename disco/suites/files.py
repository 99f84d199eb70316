"""Rows of a JSONL or CSV file (either may be gzipped): one dict per row, in order, with the file's columns. A line
that is not a JSON object, or a file that is not UTF-8, is an error naming the line."""

from __future__ import annotations

import csv
import io
import json
import zlib
from pathlib import Path

from disco.errors import BenchError

CSV_FIELD_CHARS = 1 << 21  # a cell over the csv module's default 128 KiB is read, then dropped as too long a prompt


MAX_TEXT_BYTES = 1 << 30  # a suite file's text (after gunzip): far above any benchmark's; an upload passes less


def _gunzip(raw: bytes, limit: int) -> bytes:
    """Decompress at most ``limit`` bytes: a small file that would expand past it (a gzip bomb) is refused."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflate.decompress(raw, limit + 1)
    if len(out) > limit or inflate.unconsumed_tail:
        raise BenchError(f"the suite expands to more than {limit:,} bytes when decompressed")
    return out


def read_text(path: Path, limit: int = MAX_TEXT_BYTES) -> str:
    """A suite file's text (gzip too), at most ``limit`` bytes of it."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = _gunzip(raw, limit)
        elif len(raw) > limit:
            raise BenchError(f"suite {path.name} is {len(raw):,} bytes; at most {limit:,}")
        return raw.decode("utf-8-sig")
    except OSError as exc:
        raise BenchError(f"cannot read suite {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BenchError(f"suite {path} is not UTF-8 text (byte {exc.start})") from None
    except (EOFError, zlib.error, ValueError) as exc:
        raise BenchError(f"suite {path} is not a readable gzip file: {exc}") from None


def parse_json(path: Path, text: str, where: str = ""):
    """``json.loads`` that answers in one line for anything it cannot read (deep nesting included)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BenchError(f"suite {path}: {where}not JSON ({str(exc)[:120] or type(exc).__name__})") from None


def jsonl_rows(path: Path, text: str) -> tuple[list[dict], list[str]]:
    rows, columns = [], {}
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 and friends are legal inside JSON
        if not line.strip():
            continue
        row = parse_json(path, line, f"line {n} is ")
        if not isinstance(row, dict):
            raise BenchError(f"suite {path}: line {n} is not a JSON object")
        rows.append(row)
        columns.update(dict.fromkeys(row))
    return rows, list(columns)


def csv_rows(path: Path, text: str) -> tuple[list[dict], list[str]]:
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_CHARS))
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        rows = [dict(row) for row in reader]
    except csv.Error as exc:
        raise BenchError(f"suite {path}: line {reader.line_num} is not valid CSV ({exc})") from None
    columns = [c for c in (reader.fieldnames or []) if c is not None]
    if not columns:
        raise BenchError(f"suite {path} has no header line")
    return rows, columns


def table_rows(path: Path, limit: int = MAX_TEXT_BYTES) -> tuple[list[dict], list[str]]:
    """(rows, columns) of a .jsonl / .csv file, gzipped or not, of at most ``limit`` bytes of text."""
    text = read_text(path, limit)
    suffixes = [s.lower() for s in path.suffixes]
    if ".csv" in suffixes[-2:]:
        return csv_rows(path, text)
    return jsonl_rows(path, text)
