"""Rows of a JSONL or CSV file (either may be gzipped): one dict per row, in order, with the file's columns. A line
that is not a JSON object, or a file that is not UTF-8, is an error naming the line."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

from disco.errors import BenchError

CSV_FIELD_CHARS = 1 << 21  # a cell over the csv module's default 128 KiB is read, then dropped as too long a prompt


def read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8-sig")
    except OSError as exc:
        raise BenchError(f"cannot read suite {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BenchError(f"suite {path} is not UTF-8 text (byte {exc.start})") from None
    except (EOFError, gzip.BadGzipFile, ValueError) as exc:
        raise BenchError(f"suite {path} is not a readable gzip file: {exc}") from None


def jsonl_rows(path: Path, text: str) -> tuple[list[dict], list[str]]:
    rows, columns = [], {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise BenchError(f"suite {path}: line {n} is not JSON ({exc})") from None
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


def table_rows(path: Path) -> tuple[list[dict], list[str]]:
    """(rows, columns) of a .jsonl / .csv file, gzipped or not."""
    text = read_text(path)
    suffixes = [s.lower() for s in path.suffixes]
    if ".csv" in suffixes[-2:]:
        return csv_rows(path, text)
    return jsonl_rows(path, text)
