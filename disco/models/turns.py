"""The models' turns: one model computation at a time in a process, a user's run first.

The app's races and sweeps, its background profile and a benchmark run in the same process share one pair of
models; timings and pass counts of one would spoil the other's, so they take turns (``COMPUTE_LOCK``). A user's run
takes it with ``with COMPUTE_LOCK:``; background work, which does its job in chunks and lets go between them, takes
it with ``with COMPUTE_LOCK.background:`` and so only while no user's run is waiting.

``threading.Lock`` cannot give that promise: CPython hands nothing over on release, so a thread that lets go and
at once takes the lock again usually wins over a thread already waiting (measured here: a waiter sat through 200
to 300 back-to-back 30 ms chunks, 6 to 9 s). The app's profile works in chunks of up to ~3 s, so a race started
while it ran could wait for many of them: ``scripts/compute_turns.py plain`` saw waits of 10, 10 and 72 s in one
try of five on the embedded pair (llama.cpp), against 3.0 s at most with this lock.
Users' runs are served in the order they asked (a queue), each after at most the background chunk in flight.
"""

from __future__ import annotations

import threading
from collections import deque


class ComputeLock:
    """A lock with two doors: ``with lock:`` (a user's run, first come first served) and ``with lock.background:``
    (background work: waits while the lock is held or any user's run waits for it). Not re-entrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held = False
        self._queue: deque[object] = deque()  # users' runs waiting, first come first
        self.background = _Background(self)

    def acquire(self) -> bool:
        with self._cond:
            me = object()
            self._queue.append(me)
            self._cond.notify_all()  # a waiter count changed (tests and diagnostics wait on it)
            try:
                self._cond.wait_for(lambda: not self._held and self._queue[0] is me)
            except BaseException:  # a waiter that gives up (an exception in its wait) leaves the queue
                self._queue.remove(me)
                self._cond.notify_all()
                raise
            self._queue.popleft()
            self._held = True  # nobody else can go on now: no one to wake
        return True

    def release(self) -> None:
        with self._cond:
            if not self._held:
                raise RuntimeError("release of a compute lock that is not held")
            self._held = False
            self._cond.notify_all()

    def locked(self) -> bool:
        return self._held

    def waiting(self) -> int:
        """Users' runs waiting for their turn."""
        return len(self._queue)

    def _acquire_background(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._held and not self._queue)
            self._held = True

    def __enter__(self) -> "ComputeLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _Background:
    """``with lock.background:``, reusable (``disco.bench.machine_profile.measure`` enters it once per chunk)."""

    def __init__(self, lock: ComputeLock) -> None:
        self._lock = lock

    def __enter__(self) -> ComputeLock:
        self._lock._acquire_background()
        return self._lock

    def __exit__(self, *exc) -> None:
        self._lock.release()


COMPUTE_LOCK = ComputeLock()
