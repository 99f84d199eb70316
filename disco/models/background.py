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
import weakref
from contextlib import contextmanager

SHUTDOWN = threading.Event()
JOIN_SECONDS = 30.0  # one layer or node is milliseconds; a model load (not interruptible) a few seconds

_THREADS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
_ACTIVE = 0                       # forward passes in flight, in any thread
_IN_PASS: "weakref.WeakKeyDictionary[threading.Thread, int]" = weakref.WeakKeyDictionary()  # passes per thread
_IDLE = threading.Condition()
UNWIND_SECONDS = 2.0  # how long the exit gives a thread it stopped mid-pass to leave its frames (a pool's never ends)


@contextmanager
def in_pass():
    """Around a forward pass's native code: the exit waits for it to leave (see the module doc)."""
    global _ACTIVE
    thread = threading.current_thread()
    with _IDLE:
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


def with_shutdown(interrupt):
    """``interrupt`` (a callable returning true to stop, or None) that also fires once the process is exiting."""
    if interrupt is None:
        return SHUTDOWN.is_set
    return lambda: SHUTDOWN.is_set() or interrupt()


def start(target, name: str) -> threading.Thread:
    """Run ``target`` in a daemon thread that the process's exit stops and waits for."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    _THREADS.add(thread)
    thread.start()
    return thread


@atexit.register
def _stop() -> None:
    # atexit runs after the non-daemon threads have ended and before daemon threads are cut off
    with _IDLE:
        stopped = [t for t, n in _IN_PASS.items() if n > 0]  # threads the exit interrupts mid-pass
    SHUTDOWN.set()
    for thread in list(_THREADS):
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(JOIN_SECONDS)
    with _IDLE:
        _IDLE.wait_for(lambda: _ACTIVE == 0, JOIN_SECONDS)
    # a thread nobody registered has left its pass but may still be unwinding (its exception, a print): give it a moment
    # to finish, so the interpreter does not cut it off inside native frames (a worker pool's thread never finishes)
    for thread in stopped:
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(UNWIND_SECONDS)
