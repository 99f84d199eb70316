"""A shared queue no visitor can take over (``disco.app.visitors``), through gradio_client and raw HTTP: one client
firing many runs holds one place, a second client's run starts after at most one of the first's, a refused run is
told why and where its run stands, the queue is bounded, and a visitor behind a proxy is its forwarded address.
Counts and order, never times."""

from __future__ import annotations

import threading

import pytest
from gradio_client import Client
from gradio_client.exceptions import ValidationError

import app
from disco.app.visitors import QueueRules, client_address
from disco.errors import InputError


class _Request:
    def __init__(self, forwarded: str = "", host: str = "10.0.0.9"):
        self.headers = {"x-forwarded-for": forwarded} if forwarded else {}
        self.client = type("C", (), {"host": host})()


def test_the_client_address_is_the_one_the_trusted_proxies_appended():
    assert client_address(_Request("6.6.6.6, 1.2.3.4"), 1) == "1.2.3.4"  # the left entry is the client's own claim
    assert client_address(_Request("6.6.6.6, 1.2.3.4, 5.5.5.5"), 2) == "1.2.3.4"
    assert client_address(_Request("6.6.6.6"), 0) == "10.0.0.9"
    assert client_address(_Request(""), 1) == "10.0.0.9"


def test_queue_rules_come_from_the_environment_and_bad_values_are_one_line(monkeypatch):
    assert QueueRules.from_env() == QueueRules(1, False, 0, 32)
    monkeypatch.setenv("SPACE_ID", "lab/disco")
    assert QueueRules.from_env() == QueueRules(1, True, 1, 32)
    monkeypatch.setenv("DISCO_QUEUE_MAX", "5")
    monkeypatch.setenv("DISCO_RUNS_PER_VISITOR", "0")
    assert QueueRules.from_env().max_size == 5 and QueueRules.from_env().per_visitor == 0
    for name, bad in (("DISCO_QUEUE_MAX", "0"), ("DISCO_RUNS_PER_VISITOR", "x"), ("DISCO_PROXY_HOPS", "-1"),
                      ("DISCO_LIMIT_BY_ADDRESS", "2")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(InputError, match=name):
            QueueRules.from_env()
        monkeypatch.delenv(name)


def _hold_runs(monkeypatch) -> threading.Event:
    """Every run waits at its first model pass until the returned event is set: the order of events is decided by the
    test, not by the machine's speed."""
    from disco.decode import live

    release = threading.Event()
    real = live.Decoder.step

    def held(self, interrupt=None):
        release.wait(timeout=300)
        return real(self, interrupt)

    monkeypatch.setattr(live.Decoder, "step", held)
    return release


@pytest.fixture()
def gated(serve_app, monkeypatch):
    release = _hold_runs(monkeypatch)
    with serve_app(app.build_demo("tiny")) as url:
        yield url, release
        release.set()


def _outcome(job) -> str:
    """A submitted run's end: "done", or the refusal's text (gradio_client joins the queue in the job's thread)."""
    try:
        result = job.result(timeout=300)
    except ValidationError as exc:
        return str(exc)
    return "done" if "Done" in result[0] else result[0]


def _joined(url, client, job, n: int = 1) -> None:
    """Wait (an event, not a time) until ``n`` runs are queued or running on the app, ``job``'s among them."""
    import time

    for _ in range(3000):  # a bound on polls against a hang; any machine's speed passes it
        if job.done() or job.status().code.name in ("IN_QUEUE", "PROCESSING", "ITERATING"):
            return
        time.sleep(0.01)
    raise AssertionError("the run never joined the queue")


def test_one_client_firing_fifty_runs_holds_one_place_and_a_second_client_is_served_after_one_of_them(gated):
    url, release = gated
    first, second = Client(url, verbose=False), Client(url, verbose=False)
    held = first.submit("first 0", max_new_tokens=4, baseline=False, api_name="/compare")
    _joined(url, first, held)
    flood = [first.submit(f"first {i}", max_new_tokens=4, baseline=False, api_name="/compare") for i in range(1, 50)]
    refused = [_outcome(job) for job in flood]  # each is refused when it asks to join, while the first is held
    other = second.submit("second", max_new_tokens=4, baseline=False, api_name="/compare")
    _joined(url, second, other)
    release.set()
    assert all("you already have a run" in r and "DISCO_RUNS_PER_VISITOR" in r for r in refused), refused[:3]
    assert _outcome(held) == "done" and _outcome(other) == "done"  # the second waited for one run of the first


def test_runs_fired_together_by_one_visitor_get_one_place(gated):
    """Many joins at once, before any reached the queue (the check runs before Gradio appends the event): one is
    admitted, the others refused, whatever the interleaving."""
    from concurrent.futures import ThreadPoolExecutor

    url, release = gated
    client = Client(url, verbose=False)
    with ThreadPoolExecutor(max_workers=12) as pool:
        jobs = list(pool.map(lambda i: client.submit(f"same time {i}", max_new_tokens=4, baseline=False,
                                                     api_name="/compare"), range(12)))
    outcomes = []
    for job in jobs:  # the admitted one waits for the release; let it go once the others have answered
        if not job.done():
            _joined(url, client, job)
    refused = [j for j in jobs if j.done()]
    outcomes = [_outcome(j) for j in refused]
    release.set()
    admitted = [_outcome(j) for j in jobs if j not in refused]
    assert len(admitted) == 1 and admitted == ["done"], (admitted, outcomes)
    assert len(outcomes) == 11 and all("you already have a run" in o for o in outcomes), outcomes


def test_a_refused_run_is_told_where_its_own_run_waits(gated):
    url, release = gated
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    running = a.submit("a", max_new_tokens=4, baseline=False, api_name="/compare")
    _joined(url, a, running)
    waiting = b.submit("b", max_new_tokens=4, baseline=False, api_name="/compare")
    _joined(url, b, waiting)
    assert "it waits at place 1 in the queue" in _outcome(b.submit("b again", max_new_tokens=4, api_name="/compare"))
    assert "it is running now" in _outcome(a.submit("a again", max_new_tokens=4, api_name="/compare"))
    release.set()
    assert _outcome(running) == "done" and _outcome(waiting) == "done"
    assert _outcome(a.submit("a after", max_new_tokens=4, baseline=False, api_name="/compare")) == "done"  # freed


def test_behind_a_proxy_a_visitor_is_also_its_forwarded_address(serve_app, monkeypatch):
    monkeypatch.setenv("DISCO_LIMIT_BY_ADDRESS", "1")
    monkeypatch.setenv("DISCO_PROXY_HOPS", "1")
    release = _hold_runs(monkeypatch)
    with serve_app(app.build_demo("tiny")) as url:
        same = [Client(url, verbose=False, headers={"X-Forwarded-For": f"9.9.9.{i}, 1.1.1.1"}) for i in range(2)]
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "2.2.2.2"})
        job = same[0].submit("x", max_new_tokens=4, baseline=False, api_name="/compare")
        _joined(url, same[0], job)
        # another session of the same person (the address the trusted proxy appended) is refused ...
        assert "you already have a run" in _outcome(same[1].submit("y", max_new_tokens=4, api_name="/compare"))
        third = other.submit("z", max_new_tokens=4, baseline=False, api_name="/compare")  # ... another person is not
        _joined(url, other, third)
        release.set()
        assert _outcome(job) == "done" and _outcome(third) == "done"


def test_the_queue_is_bounded(serve_app, monkeypatch):
    """DISCO_QUEUE_MAX=2: with one run held, two more may wait; a fourth visitor is refused at once."""
    monkeypatch.setenv("DISCO_QUEUE_MAX", "2")
    release = _hold_runs(monkeypatch)
    with serve_app(app.build_demo("tiny")) as url:
        clients = [Client(url, verbose=False) for _ in range(4)]
        jobs = []
        for i, client in enumerate(clients[:3]):
            jobs.append(client.submit(f"p{i}", max_new_tokens=4, baseline=False, api_name="/compare"))
            _joined(url, client, jobs[-1])
        refused = None
        try:
            clients[3].predict("p3", max_new_tokens=4, api_name="/compare")
        except Exception as exc:  # noqa: BLE001 - gradio_client's QueueError
            refused = str(exc)
        release.set()
        done = [_outcome(j) for j in jobs]
    assert refused is not None and "Queue is full" in refused, refused
    assert done == ["done"] * 3


def test_a_visitors_runs_one_after_another_are_all_served(serve_app):
    """One place at a time is not one run in all: each run, once finished, frees the visitor's place at once, however
    quickly it finished (the short runs of the tiny pair finish within the gate's reservation time)."""
    with serve_app(app.build_demo("tiny")) as url:
        client = Client(url, verbose=False)
        results = [client.predict(f"run {i}", max_new_tokens=2, baseline=False, api_name="/compare")[0]
                   for i in range(6)]
    assert all("Done" in r for r in results), results


def test_the_gate_reads_gradios_queue_records():
    """The gate reads the pinned Gradio's queue (its waiting and running events): fail here, not silently, if a
    Gradio upgrade renames them."""
    from gradio.queueing import EventQueue, Queue

    assert "queue" in EventQueue("x", 1).__dict__
    assert "active_jobs" in Queue.__init__.__code__.co_names
    assert "event_queue_per_concurrency_id" in Queue.__init__.__code__.co_names
    import inspect

    push = inspect.getsource(Queue.push)  # every queued event recorded with its session and wall time
    assert "self.event_analytics[event._id]" in push and '"session_hash": body.session_hash' in push
    assert '"time": time.time()' in push
