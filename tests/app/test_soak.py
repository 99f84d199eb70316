"""Load and soak on the tiny pair: concurrent callers, cancels in a row, and memory over many runs."""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from gradio_client import Client

import app
from disco.app.race_tab import OUTPUT_LABELS

ITERATIONS_CSV, TOKENS_CSV, SUMMARY = (OUTPUT_LABELS.index(n) for n in ("iterations_csv", "tokens_csv", "summary"))

MEMORY_BOUND_MB = 60  # measured 10.9 MB over 50 runs on the tiny pair (2026-12-03); bound with margin


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


@pytest.fixture(scope="module")
def url(serve_app, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISCO_CACHE", str(tmp_path_factory.mktemp("replay")))
        with serve_app(app.build_demo("tiny"), **app.launch_kwargs()) as u:
            yield u


def _valid_trace(result, lanes=3) -> bool:
    trace = pd.read_csv(result[ITERATIONS_CSV])
    return "Done" in result[0] and trace["strategy"].nunique() == lanes and \
        all((rows["emitted"].sum() == rows["new_tokens"].iloc[-1]) for _, rows in trace.groupby("strategy"))


def test_twenty_concurrent_compares_all_complete_with_valid_traces(url):
    def one(i):
        return Client(url, verbose=False).predict(f"def f{i}(x):", max_new_tokens=8, api_name="/compare")

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    assert sum(_valid_trace(r) for r in results) == 20


def test_ten_cancels_in_a_row_leave_the_app_ready(url):
    client = Client(url, verbose=False)
    for i in range(10):
        job = client.submit(f"Once upon a time {i}", max_new_tokens=512, api_name="/compare")
        deadline = time.monotonic() + 30
        while job.status().code.name not in ("PROCESSING", "ITERATING") and time.monotonic() < deadline:
            time.sleep(0.02)
        job.cancel()
    assert _valid_trace(client.predict("def ok(x):", max_new_tokens=8, api_name="/compare"))


def test_fifty_runs_do_not_grow_memory(url):
    client = Client(url, verbose=False)
    for i in range(10):  # warm up: caches, Gradio's first files
        client.predict(f"warm {i}", max_new_tokens=8, api_name="/compare")
    gc.collect()
    before = _rss_mb()
    for i in range(50):
        client.predict(f"run {i}", max_new_tokens=8, api_name="/compare")
    gc.collect()
    grown = _rss_mb() - before
    print(f"RSS grew {grown:.1f} MB over 50 runs (bound {MEMORY_BOUND_MB} MB)")
    assert grown < MEMORY_BOUND_MB


def test_a_client_that_goes_away_frees_the_queue(url, monkeypatch):
    """Raw HTTP: a caller streams a long run for a moment and disconnects without cancelling. Gradio then stops
    iterating the run, so the next caller is served at once. Checked by counts, whatever the machine's speed: the
    iterations the abandoned run made before the next run began are fewer than a whole long run makes."""
    import httpx

    from disco.decode.live import Decoder

    steps = {"long": 0, "at_next": None, "long_len": None}
    real_step = Decoder.step

    def counted(self, interrupt=None):
        if steps["long_len"] is None:
            steps["long_len"] = self.prompt_len  # the first iteration of all is the long run's
        if self.prompt_len == steps["long_len"] and steps["at_next"] is None:
            steps["long"] += 1
        elif self.prompt_len != steps["long_len"] and steps["at_next"] is None:
            steps["at_next"] = steps["long"]  # the next run's first iteration: how far the abandoned one got
        return real_step(self, interrupt)

    monkeypatch.setattr(Decoder, "step", counted)
    long = ["Once upon a time", "static:32", "threshold:0:32", 5, 0.4, 32, 512, True, False, False, 1.0, 1.0, 0,
            "default", "default", "default"]
    short = ["abc", *long[1:6], 4, *long[7:]]
    with httpx.Client(timeout=600) as http:
        def call(data):
            event = http.post(f"{url}gradio_api/call/compare", json={"data": data}).json()["event_id"]
            return f"{url}gradio_api/call/compare/{event}"

        with http.stream("GET", call(long)) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: generating"):
                    break  # the run is going: walk away
        assert "event: complete" in http.get(call(short)).text
        abandoned = steps["at_next"]
        steps.update(long=0, at_next=None)
        assert "event: complete" in http.get(call(long)).text
        whole = steps["long"]
    assert abandoned is not None and abandoned < whole, (abandoned, whole)
