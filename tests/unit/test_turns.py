"""The models' turns: a user's run waits for at most the chunk of background work in flight, never for the whole
background job, and runs take the models in the order they asked (no timing is asserted: events and counts only)."""

from __future__ import annotations

import threading

import pytest

from disco.models.turns import ComputeLock

JOIN = 60.0  # a safety net against a hang, never a measurement


def _wait_for_waiters(lock: ComputeLock, n: int) -> None:
    with lock._cond:
        assert lock._cond.wait_for(lambda: lock.waiting() >= n, timeout=JOIN), "the waiter never queued"


def test_a_user_run_waits_for_one_background_chunk_not_the_whole_job():
    lock = ComputeLock()
    chunks_done = 0
    in_chunk = threading.Event()
    release_chunk = threading.Event()
    stop = threading.Event()

    def background():  # re-takes the models as soon as it let them go, like the app's profile
        nonlocal chunks_done
        while not stop.is_set():
            with lock.background:
                in_chunk.set()
                release_chunk.wait(JOIN)
                chunks_done += 1

    worker = threading.Thread(target=background, daemon=True)
    worker.start()
    assert in_chunk.wait(JOIN)
    seen = []

    def user():
        with lock:
            seen.append(chunks_done)
            stop.set()

    runner = threading.Thread(target=user, daemon=True)
    runner.start()
    try:
        _wait_for_waiters(lock, 1)  # the user's run is queued while the first chunk holds the models
        release_chunk.set()         # from now on every chunk would end at once: the background loop spins
        runner.join(JOIN)
    finally:
        stop.set()
        release_chunk.set()
    worker.join(JOIN)
    assert not runner.is_alive() and not worker.is_alive()
    assert seen == [1], f"the user's run got the models after {seen} background chunks, not after the first"


def test_user_runs_take_turns_in_the_order_they_asked():
    lock = ComputeLock()
    order = []
    lock.acquire()
    threads = []
    for i in range(4):
        t = threading.Thread(target=lambda i=i: (lock.acquire(), order.append(i), lock.release()), daemon=True)
        t.start()
        _wait_for_waiters(lock, i + 1)
        threads.append(t)
    lock.release()
    for t in threads:
        t.join(JOIN)
    assert order == [0, 1, 2, 3]


def test_background_work_waits_while_a_user_run_holds_the_models():
    lock = ComputeLock()
    got = threading.Event()
    lock.acquire()

    def background():
        with lock.background:
            got.set()

    worker = threading.Thread(target=background, daemon=True)
    worker.start()
    assert not got.wait(0.2)  # held by the user: the background job has not started (no timing asserted)
    lock.release()
    worker.join(JOIN)
    assert got.is_set()
    assert not lock.locked() and lock.waiting() == 0


def test_the_lock_is_released_when_the_work_raises():
    lock = ComputeLock()
    with pytest.raises(RuntimeError):
        with lock:
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        with lock.background:
            raise RuntimeError("boom")
    assert not lock.locked()
    with lock:
        assert lock.locked()


def test_release_of_a_free_lock_is_an_error():
    with pytest.raises(RuntimeError, match="not held"):
        ComputeLock().release()


def test_a_run_that_gives_up_waiting_does_not_block_the_runs_after_it():
    lock = ComputeLock()
    real_wait_for = lock._cond.wait_for

    def wait_for(predicate, timeout=None):  # the waiter named "quitter" fails in its wait (say, interrupted)
        if threading.current_thread().name == "quitter":
            raise KeyboardInterrupt
        return real_wait_for(predicate, timeout)

    lock._cond.wait_for = wait_for
    lock.acquire()
    failed = []

    def quitter():
        try:
            lock.acquire()
        except KeyboardInterrupt:
            failed.append(True)

    q = threading.Thread(target=quitter, name="quitter", daemon=True)
    q.start()
    q.join(JOIN)
    assert failed == [True] and lock.waiting() == 0
    lock.release()
    done = []

    def later():
        with lock:
            done.append("run")
        with lock.background:
            done.append("background")

    t = threading.Thread(target=later, daemon=True)
    t.start()
    t.join(JOIN)
    assert done == ["run", "background"]
