"""Which prompts a sweep replays: a suite from the menu (the built-in suite, HumanEval) or an uploaded file (a Spec-Bench
/ MT-Bench ``question.jsonl``, a HumanEval-format file, any JSONL or CSV with a prompt column, or our JSON), then the
ticked prompts or a seeded sample stratified by kind (``disco.suites``). Uploads are bounded: at most
``DISCO_MAX_UPLOAD_MB`` on disk (Gradio refuses bigger files before they arrive, ``max_file_size``), 32 MB of text
once decompressed, and ``UPLOAD_MAX_PROMPTS`` prompts; the first turn of a multi-turn question (the command line runs every turn)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from disco import suites
from disco.errors import BenchError
from disco.limits import as_int, upload_limit

BUILTIN, HUMANEVAL, UPLOAD = "built-in suite", "HumanEval (164 problems)", "uploaded file"
MENU = [BUILTIN, HUMANEVAL, UPLOAD]
SPECS = {BUILTIN: suites.BUILTIN_NAME, HUMANEVAL: suites.HUMANEVAL}
UPLOAD_MAX_PROMPTS = 5000
UPLOAD_MAX_TEXT_BYTES = 32 * 1024 * 1024  # an upload's text after gunzip (a small .gz cannot expand past it)
SAMPLE_MAX = 500        # prompts one sweep's sample may ask for (the work limit still applies)
CHOICES_SHOWN = 300     # prompts listed for ticking (a sample reaches the rest)
UPLOAD_TYPES = [".json", ".jsonl", ".csv", ".gz"]


def load(menu: str | None, upload: str | None) -> suites.Suite:
    """The suite the menu names, or the uploaded file (checked for size first). One line for any problem."""
    choice = str(menu or BUILTIN)
    if choice == UPLOAD or (upload and choice not in SPECS):
        if not upload:
            raise BenchError("upload a suite file first (.jsonl, .csv or .json), or pick a suite from the menu")
        path = Path(str(upload))
        try:
            size = os.path.getsize(path)
        except OSError:
            raise BenchError("the uploaded suite file is gone; upload it again") from None
        if size > upload_limit():
            raise BenchError(f"the uploaded suite is {size / 1e6:.1f} MB; at most {upload_limit() / 1e6:.1f} MB "
                             "(DISCO_MAX_UPLOAD_MB)")
        return suites.load_suite(str(path), suites.SuiteOptions(max_prompts=UPLOAD_MAX_PROMPTS,
                                                                max_bytes=UPLOAD_MAX_TEXT_BYTES))
    if choice not in SPECS:
        raise BenchError(f"unknown suite {choice[:60]!r}: choose {', '.join(MENU)}")
    return suites.load_suite(SPECS[choice])


def choices(suite: suites.Suite) -> list[tuple[str, str]]:
    """The prompts offered for ticking (label, id), the first ``CHOICES_SHOWN``."""
    return [(f"{p.id} ({p.kind})", p.id) for p in suite.prompts[:CHOICES_SHOWN]]


def default_ticks(suite: suites.Suite) -> list[str]:
    """One prompt of each kind (at most six), as the built-in suite's first view always had."""
    shown = list(suite.prompts[:CHOICES_SHOWN])
    return [p.id for p in suites.pick_prompts(shown, min(6, len(suite.kinds)))]


def picked(suite: suites.Suite, ticked, sample_n, sample_seed) -> list[suites.SuitePrompt]:
    """The ticked prompts, or a seeded sample of ``sample_n`` stratified by kind when it is above 0; splits assigned
    as the command line assigns them."""
    n = 0 if sample_n in (None, "") else as_int(sample_n, "sample size")
    seed = 0 if sample_seed in (None, "") else as_int(sample_seed, "sample seed")
    if not 0 <= n <= SAMPLE_MAX:
        raise BenchError(f"sample size must be between 0 (the ticked prompts) and {SAMPLE_MAX}, got {n}")
    if not 0 <= seed < 2**32:
        raise BenchError(f"sample seed must be between 0 and 2**32 - 1, got {seed}")
    prompts = list(suite.prompts)
    if n:
        return suites.assign_splits(suites.sample_units(prompts, n, seed))
    if isinstance(ticked, str):
        ticked = [ticked]
    by_id = {p.id: p for p in prompts}
    unknown = [i for i in (ticked or []) if not isinstance(i, str) or i not in by_id]
    if unknown:
        raise BenchError(f"unknown prompt {str(unknown[0])[:80]!r} in {suite.name}")
    chosen = [by_id[i] for i in dict.fromkeys(ticked or [])]
    if not chosen:
        raise BenchError("pick at least one prompt, or give a sample size")
    which = suites.split_of(suites.assign_splits(prompts))
    return [dataclasses.replace(p, split=which[p.id]) for p in chosen]
