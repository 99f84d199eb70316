"""The quick bench's replay on the tiny pair under ``flat:0.05``, against golden copies of its reports (tests/golden/):
``runs.csv`` and ``summary.csv`` byte for byte, ``summary.md`` line for line except the lines that name this machine,
the versions, wall seconds or the time, and ``prompts.csv`` except its timing columns. Two selections: four prompts of
the built-in suite, and a chat suite whose later turns follow the target's answers, cut or skipped by the length rule
(tests/golden/turns.jsonl). Each runs twice on one cache: once building the tables (the models loaded), once
re-costing them from the cache (no model loaded where every prompt has a table), which writes the same numbers.

The golden copies were written by the code before the table phase (``disco.tables``) was built, so they pin its
behaviour. To write them again (only where a change of the numbers is meant): ``DISCO_WRITE_GOLDEN=1 pytest
tests/unit/test_golden_bench.py``."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from disco import cli

pytestmark = pytest.mark.slow  # statistical / end-to-end runs: out of the fast tier (./test.sh -m fast)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = {
    "bench_replay_flat": ["--prompts", "code-binary-search,explain-gil,prose-advice,summ-email"],
    "bench_replay_turns": ["--suite", str(GOLDEN / "turns.jsonl"), "--turns", "all", "--max-prompt-tokens", "96",
                           "--long-prompts", "middle"],
}
# what names this machine, the versions, the time or wall seconds: left out of the comparison of summary.md
VOLATILE = re.compile(r"^(Machine:|Versions:|Wall time|Replay tables: .* s in this process)")
TIMING_COLUMNS = ["seconds", "reference_seconds", "chain_seconds", "chain_passes"]  # prompts.csv: this process's work
WRITE = os.environ.get("DISCO_WRITE_GOLDEN") == "1"


def bench(case: str, out: Path, cache_dir: Path) -> None:
    code = cli.main(["bench", "--models", "tiny", "--mode", "replay", "--max-new-tokens", "16", *CASES[case],
                     "--cost-profile", "flat:0.05", "--no-peer", "--out", str(out), "--cache-dir", str(cache_dir),
                     "--no-progress"])
    assert code == 0


def markdown(path: Path, out: Path, cache_dir: Path) -> list[str]:
    text = path.read_text(encoding="utf-8").replace(str(out), "OUT").replace(str(cache_dir), "CACHE")
    text = text.replace(os.environ["DISCO_CLASSIFIER"], "CLASSIFIER")  # the test session's own (tests/conftest.py)
    text = text.replace(str(GOLDEN), "GOLDEN")
    return [line for line in text.splitlines() if not VOLATILE.match(line)]


def prompts_table(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype={"prompt_id": str, "question": str})
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])


def tables(cache_dir: Path) -> dict[str, str]:
    """Each cached table's file name and a hash of its bytes (a table holds only what the models compute)."""
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(cache_dir.glob("*.json"))}


@pytest.fixture(scope="module", params=list(CASES))
def runs(request, tmp_path_factory):
    """The case, and (out folder, cache folder) of its first run (tables built), then of its second (re-costed)."""
    root = tmp_path_factory.mktemp(request.param)
    cache_dir = root / "cache"
    bench(request.param, root / "built", cache_dir)
    bench(request.param, root / "recosted", cache_dir)
    return request.param, {which: (root / which, cache_dir) for which in ("built", "recosted")}


@pytest.mark.parametrize("which", ["built", "recosted"])
def test_the_bench_report_is_the_golden_one(runs, which):
    """Both runs write the same runs, summary and report (one golden copy); their prompts.csv differ in where each
    table came from (built here, or the cache). The cache holds the same tables, byte for byte."""
    case, folders = runs
    out, cache_dir = folders[which]
    golden = GOLDEN / case
    prompts_csv = golden / f"prompts_{which}.csv"
    if WRITE:
        golden.mkdir(parents=True, exist_ok=True)
        if which == "built":
            for name in ("runs.csv", "summary.csv"):
                (golden / name).write_bytes((out / name).read_bytes())
            (golden / "summary.md").write_text("\n".join(markdown(out / "summary.md", out, cache_dir)) + "\n",
                                               encoding="utf-8")
        prompts_table(out / "prompts.csv").to_csv(prompts_csv, index=False)
        (golden / "tables.json").write_text(json.dumps(tables(cache_dir), indent=1) + "\n")
    for name in ("runs.csv", "summary.csv"):
        assert (out / name).read_bytes() == (golden / name).read_bytes(), f"{case}/{which}: {name} is not golden"
    assert markdown(out / "summary.md", out, cache_dir) == (golden / "summary.md").read_text(
        encoding="utf-8").splitlines()
    pd.testing.assert_frame_equal(prompts_table(out / "prompts.csv"),
                                  pd.read_csv(prompts_csv, dtype={"prompt_id": str, "question": str}))
    assert tables(cache_dir) == json.loads((golden / "tables.json").read_text())  # the same tables, byte for byte
