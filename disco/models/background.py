"""Model work in background threads, and the interpreter's exit.

The app loads its pair and measures this machine's cost profile in a daemon thread (``disco.app.loader``). When the
process exits while that thread is inside a forward pass, Python ends the thread with ``pthread_exit``, whose forced
unwinding through torch's or llama.cpp's C++ frames calls ``std::terminate``: the process aborts (exit code 134,
with ggml's backtrace) instead of exiting. Seen in the test suite: a llama.cpp pair loaded, then an app built, then
pytest exits during the app's background profile.

So every forward pass also polls ``SHUTDOWN`` (``disco.models.pair.TorchSession``, ``disco.models.llama``) and is
counted while it runs (``in_pass``): at exit it is set, the pass in flight, in whatever thread (the loader started
here, or a Gradio worker running a race), stops at its next layer (torch) or graph node (llama.cpp) with
``Interrupted``, and the exit waits until no pass is in flight and the threads started here have unwound.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from contextlib import contextmanager

from disco.errors import Interrupted

SHUTDOWN = threading.Event()
JOIN_SECONDS = 30.0  # one layer or node is milliseconds; a model load (not interruptible) a few seconds

_THREADS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
_ACTIVE = 0                       # forward passes in flight, in any thread
_IN_PASS: "weakref.WeakKeyDictionary[threading.Thread, int]" = weakref.WeakKeyDictionary()  # passes per thread
_STOPPED: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()  # threads the exit stopped in or before a pass
_IDLE = threading.Condition()
CHECK_IN_SECONDS = 0.5  # how long the exit waits for threads between two passes to reach their next check
UNWIND_SECONDS = 2.0  # how long the exit gives a thread it stopped mid-pass to leave its frames (a pool's never ends)


@contextmanager
def in_pass():
    """Around a forward pass's native code: the exit waits for it to leave (see the module doc). Once the exit has
    begun, no pass starts: checked under the same lock the exit sets ``SHUTDOWN`` under, so a thread that had passed
    an earlier check cannot slip into native code after the exit stopped waiting (then Python cut it off there:
    ``std::terminate``, or a crash in the final collection; seen once in CI and 2 in 40 runs here)."""
    global _ACTIVE
    thread = threading.current_thread()
    with _IDLE:
        if SHUTDOWN.is_set():
            _STOPPED.add(thread)
            raise Interrupted("stopped before a forward pass: the process is exiting")
        _ACTIVE += 1
        _IN_PASS[thread] = _IN_PASS.get(thread, 0) + 1
    try:
        yield
    finally:
        with _IDLE:
            _ACTIVE -= 1
            _IN_PASS[thread] -= 1
            if _ACTIVE == 0:
                _IDLE.notify_all()


def exiting() -> bool:
    """Whether the process is exiting; if so the calling thread counts as stopped by it, and the exit gives it a
    moment to unwind (see ``_stop``). For checks before a pass; ``in_pass`` checks again under its lock."""
    if not SHUTDOWN.is_set():
        return False
    with _IDLE:
        _STOPPED.add(threading.current_thread())
    return True


def with_shutdown(interrupt):
    """``interrupt`` (a callable returning true to stop, or None) that also fires once the process is exiting."""
    if interrupt is None:
        return exiting
    return lambda: exiting() or interrupt()


def start(target, name: str) -> threading.Thread:
    """Run ``target`` in a daemon thread that the process's exit stops and waits for."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    _THREADS.add(thread)
    thread.start()
    return thread


def _check_in(me: threading.Thread) -> None:
    """Give every thread that has run passes and was between two of them when the exit began (in torch's or
    llama.cpp's native code outside a pass: a cache crop, a sampling op, both of which release the GIL) up to
    ``CHECK_IN_SECONDS`` to reach its next check and so count as stopped. A decoding loop gets there in milliseconds;
    an idle worker that ran a race earlier never does, and costs the exit this wait once, not once per thread. Without
    it the interpreter cut such a thread off inside torch (``std::terminate``: 5 exits in 12 here, torch, a plain
    thread)."""
    deadline = time.monotonic() + CHECK_IN_SECONDS
    while time.monotonic() < deadline:
        with _IDLE:
            pending = [t for t in _IN_PASS if t not in _STOPPED and t.is_alive() and t is not me]
        if not pending:
            return
        time.sleep(0.005)


@atexit.register
def _stop() -> None:
    # atexit runs after the non-daemon threads have ended and before daemon threads are cut off
    with _IDLE:
        SHUTDOWN.set()  # under the lock in_pass checks it under: from here on no pass starts
        _STOPPED.update(t for t, n in _IN_PASS.items() if n > 0)  # threads the exit interrupts mid-pass
    me = threading.current_thread()
    for thread in list(_THREADS):
        if thread.is_alive() and thread is not me:
            thread.join(JOIN_SECONDS)
    with _IDLE:
        _IDLE.wait_for(lambda: _ACTIVE == 0, JOIN_SECONDS)
    _check_in(me)
    # a thread nobody registered has left its pass but may still be unwinding (its exception, a print): give it a moment
    # to finish, so the interpreter does not cut it off inside native frames (a worker pool's thread never finishes)
    joined: set[threading.Thread] = set()
    while True:
        with _IDLE:
            waiting = [t for t in _STOPPED if t not in joined and t.is_alive() and t is not me]
        if not waiting:
            return
        for thread in waiting:  # one that stops meanwhile (before its next pass) is joined on the next round
            joined.add(thread)
            thread.join(UNWIND_SECONDS)
