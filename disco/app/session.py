"""What the app keeps per process and per browser session: the compute lock every run takes turns on, the Stop
signals of each session, and the CSV files offered for download (bounded on disk)."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import gradio as gr

from disco.models.turns import COMPUTE_LOCK  # noqa: F401 - the race, the sweep and the background profile take turns


STOP_LABEL = "■ Stop"


class StopSignals:
    """Stop requests, one per browser session, that a running race reads between iterations.

    Stop does not kill the run: a killed generator could not hand over what it had, and the forward pass in
    flight would go on computing in its worker thread while the next visitor's run started, spoiling both
    timings. The race sees the request before its next forward pass, abandons that iteration, writes the
    completed iterations to the CSV files and ends with a "Stopped" status. ``arm`` is called when Run is pressed (so a Stop pressed earlier
    does not cancel the new run) and ``done`` when the run has ended, queued or not.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}
        self._active: set[str] = set()

    def _event(self, session: str | None) -> threading.Event:
        with self._lock:
            if len(self._events) > 4096:  # sessions come and go: forget the idle ones
                self._events = {k: e for k, e in self._events.items() if k in self._active}
            return self._events.setdefault(session or "", threading.Event())

    def arm(self, session: str | None) -> None:
        self._event(session).clear()
        with self._lock:
            self._active.add(session or "")

    def done(self, session: str | None) -> None:
        with self._lock:
            self._active.discard(session or "")

    def request(self, session: str | None) -> bool:
        """Ask the session's run to stop; true when it has one queued or running. With nothing queued or
        running it is a no-op, so a Stop pressed in an idle session cannot end the next run."""
        event = self._event(session)
        with self._lock:
            active = (session or "") in self._active
            if active:
                event.set()
        return active

    def checker(self, session: str | None) -> Callable[[], bool]:
        return self._event(session).is_set

    def for_request(self, request: gr.Request | None) -> Callable[[], bool]:
        """The stop check of the session behind ``request`` (an API call without one gets a slot of its own).

        A run that arrives without Run's ``arm`` (an API call straight to the endpoint) starts with a clear
        signal: no Stop from before it can apply to it."""
        session = request.session_hash if request is not None else None
        with self._lock:
            armed = (session or "") in self._active
        if not armed:
            self._event(session).clear()
        return self.checker(session)

    def wire(self, run: gr.Button, stop: gr.Button, fn, inputs, outputs, **event):
        """Connect a Run/Stop pair: Run arms this session's signal (unqueued), then queues ``fn`` (which polls
        ``for_request``) with ``event``'s options, then restores the Stop button whether ``fn`` ended, stopped
        or failed; Stop asks ``fn`` to end and says "Stopping…" until it has. Returns ``fn``'s event."""

        def arm(request: gr.Request):
            self.arm(request.session_hash)

        def ask(request: gr.Request):
            if self.request(request.session_hash):  # a run is queued or going: say so until it has ended
                return gr.update(value="■ Stopping…", interactive=False)
            return gr.skip()

        def ended(request: gr.Request):
            self.done(request.session_hash)
            return gr.update(value=STOP_LABEL, interactive=True)

        private = dict(queue=False, api_visibility="private")
        run_event = run.click(arm, None, None, **private).then(fn, inputs, outputs, **event)
        run_event.then(ended, None, [stop], **private)
        stop.click(ask, None, [stop], **private)
        return run_event


_CSV_DIR: Path | None = None
_CSV_LOCK = threading.Lock()
KEEP_CSV_RUNS = 40


def csv_dir() -> Path:
    """One temp folder per process (Gradio serves files from the system temp dir)."""
    global _CSV_DIR
    with _CSV_LOCK:
        if _CSV_DIR is None or not _CSV_DIR.is_dir():
            _CSV_DIR = Path(tempfile.mkdtemp(prefix="disco-lab-"))
        return _CSV_DIR


def write_csvs(snapshot, directory: Path | None = None) -> tuple[str, str, str]:
    """Write the per-iteration and per-token traces and the acceptance by draft position (with the run's settings on
    every row)."""
    directory = Path(directory) if directory is not None else csv_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.perf_counter_ns() % 1_000_000:06d}"
    paths = {name: directory / f"disco-trace-{stamp}-{name}.csv" for name in ("iterations", "tokens", "positions")}
    snapshot.export_iterations().to_csv(paths["iterations"], index=False)
    snapshot.export_tokens().to_csv(paths["tokens"], index=False)
    snapshot.export_positions().to_csv(paths["positions"], index=False)
    old = sorted(directory.glob("disco-trace-*.csv"), key=lambda p: p.stat().st_mtime)
    for path in old[: max(0, len(old) - len(paths) * KEEP_CSV_RUNS)]:
        path.unlink(missing_ok=True)
    return str(paths["iterations"]), str(paths["tokens"]), str(paths["positions"])
