#!/usr/bin/env python3
"""One progress line for the set-up's jobs running side by side (issue 35; stdlib only).

    progress.py JOB [JOB ...]     JOB = NAME:KIND:LOG:RC[:EXPECT]

Each job writes its output to LOG and its exit status to RC when it ends. KIND says how to read LOG:
``pip`` counts the packages pip has collected (EXPECT: how many a full install collects, from the last install on
this machine or the figure measured on a fresh one) and then waits for pip's "Successfully installed";
``build`` reads the build's own counter (ninja's ``[n/N]`` or make's ``[ n%]``). Every job gets a bar, its elapsed
time and an estimate of what is left; on a terminal the line is redrawn every second, elsewhere (CI, a log) a new
line is printed every ``--every`` seconds (default 10), so the set-up never goes quiet for longer. Exits when every
job has ended, with 1 if any failed (its last log lines are printed).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE = re.compile(r"^\[\s*(\d+)%\]")
_COLLECT = re.compile(r"^Collecting |^Requirement already satisfied")


@dataclass
class Job:
    name: str
    kind: str
    log: Path
    rc: Path
    expect: int = 0
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    status: int | None = None
    done: float = 0.0  # fraction
    detail: str = ""
    _first: tuple[float, float] | None = None  # (when, fraction) of the first progress read: the rate counts from it
    _offset: int = 0
    _count: int = 0
    _installing: bool = False

    def poll(self, now: float) -> None:
        if self.log.exists():
            with self.log.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
            cut = chunk.rfind(b"\n") + 1  # whole lines only
            self._offset += cut
            for line in chunk[:cut].decode("utf-8", "replace").splitlines():
                self._read(line.strip())
        if self._first is None and self.done > 0:
            self._first = (now, self.done)
        if self.status is None and self.rc.exists():
            text = self.rc.read_text().strip()
            if text:
                self.status, self.ended = int(text), now
                self.done = 1.0 if self.status == 0 else self.done

    def _read(self, line: str) -> None:
        if self.kind == "pip":
            if _COLLECT.match(line):
                self._count += 1
                total = max(self.expect, self._count)
                self.done = 0.85 * self._count / total
                self.detail = f"{self._count}/{'~' if self.expect else ''}{total} packages collected"
            elif line.startswith("Installing collected packages"):
                self._installing, self.done = True, max(self.done, 0.85)
                self.detail = f"installing {self._count} packages"
            elif line.startswith(("setup: preparing", "setup: compiling")):  # after pip (scripts/setup.sh)
                self.done, self.detail = max(self.done, 0.95), line.removeprefix("setup: ")
        else:
            m = _NINJA.match(line)
            if m:
                n, total = int(m[1]), int(m[2])
                if n / total < self.done:  # a next phase's steps (llama.cpp's programs after the wheel): its own rate
                    self._first = None
                self.done, self.detail = n / total, f"{n}/{total} steps"
            elif (m := _MAKE.match(line)):
                self.done, self.detail = int(m[1]) / 100, f"{m[1]}%"

    def line(self, now: float) -> str:
        elapsed = (self.ended or now) - self.started
        if self.status is not None:
            verdict = "done" if self.status == 0 else f"FAILED (exit {self.status})"
            return f"{self.name} {verdict} in {_clock(elapsed)}"
        bar = _bar(self.done)
        left = ""
        if self._first is not None and now > self._first[0] and self.done - self._first[1] >= 0.02:
            rate = (self.done - self._first[1]) / (now - self._first[0])  # from the first progress seen, so a job's
            left = f", ~{_clock((1 - self.done) / rate)} left"             # quiet start (a download) does not count
        return f"{self.name} {bar} {self.detail or 'starting'} ({_clock(elapsed)}{left})"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _bar(fraction: float, width: int = 20) -> str:
    filled = int(round(width * min(max(fraction, 0.0), 1.0)))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def parse_job(spec: str) -> Job:
    parts = spec.split(":")
    if len(parts) not in (4, 5) or parts[1] not in ("pip", "build"):
        raise SystemExit(f"progress: bad job {spec!r} (NAME:pip|build:LOG:RC[:EXPECT])")
    return Job(parts[0], parts[1], Path(parts[2]), Path(parts[3]), int(parts[4]) if len(parts) == 5 and parts[4] else 0)


def watch(jobs: list[Job], every: float, out=sys.stderr, tty: bool | None = None, sleep=time.sleep,
          quiet_under: float = 0.0) -> int:
    tty = out.isatty() if tty is None else tty
    begun = time.monotonic()
    last = begun  # the first line after `every` seconds (the set-up has just said what it starts)
    while True:
        now = time.monotonic()
        for job in jobs:
            job.poll(now)
        finished = all(job.status is not None for job in jobs)
        if now - begun < quiet_under and not finished:
            sleep(0.2)
            continue
        if finished and now - begun < quiet_under and not any(job.status for job in jobs):
            return 0  # all there already: nothing to say
        text = "setup: " + "  |  ".join(job.line(now) for job in jobs)
        if tty:  # one row, redrawn: cut to the terminal's width (a wrapped line would leave a row behind each time)
            width = shutil.get_terminal_size((120, 24)).columns - 1
            out.write("\r\033[K" + (text[:width] if not finished else text) + ("\n" if finished else ""))
            out.flush()
        elif finished or now - last >= every:
            out.write(text + "\n")
            out.flush()
            last = now
        if finished:
            break
        sleep(1.0)
    failed = [job for job in jobs if job.status]
    for job in failed:
        tail = job.log.read_text(errors="replace").splitlines()[-15:] if job.log.exists() else []
        out.write(f"setup: {job.name} failed; the end of {job.log}:\n" + "".join(f"  {t}\n" for t in tail))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jobs", nargs="+", help="NAME:pip|build:LOG:RC[:EXPECT]")
    ap.add_argument("--every", type=float, default=float(os.environ.get("DISCO_PROGRESS_EVERY", 10)))
    ap.add_argument("--quiet-under", type=float, default=0.0, help="say nothing when every job ends this soon, well")
    args = ap.parse_args(argv)
    return watch([parse_job(spec) for spec in args.jobs], args.every, quiet_under=args.quiet_under)


if __name__ == "__main__":
    sys.exit(main())
