"""The app's batch-size endpoints through gradio_client on the tiny pair: the Sweep's answer per batch size (after a
sweep in the same session) and a finished race re-costed as in a batch of B; bad input is one line, never a 500."""

from __future__ import annotations

import pytest
from gradio_client import handle_file


@pytest.fixture(scope="module")
def client(serve_app, tmp_path_factory):
    from gradio_client import Client

    import app

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISCO_CACHE", str(tmp_path_factory.mktemp("replay-batch")))
        with serve_app(app.build_demo("tiny"), **app.launch_kwargs()) as url:
            yield Client(url, verbose=False)


def test_sweep_batch_needs_a_sweep_then_answers_per_batch_size(client):
    status = client.predict("1,2", "ragged", api_name="/sweep_batch")[0]
    assert status.startswith("⚠") and "run a sweep first" in status and "\n" not in status.strip()
    client.predict(["code-complete-fib", "explain-gil", "prose-advice", "summ-email"], "1,3", "0.4", "4", False, False,
                   8, "flat:0.1", None, api_name="/sweep")
    status, _plot, table = client.predict("1,2,4", "padded-max", api_name="/sweep_batch")
    assert status.startswith("Costs: **flat:0.1") and "padded-max" in status
    assert [row[0] for row in table["data"]] == [1, 2, 4]
    for bad, needle in (("0", "out of range"), ("1,2,x", "whole number"), ("", "at least one batch size")):
        status = client.predict(bad, "ragged", api_name="/sweep_batch")[0]
        assert status.startswith("⚠") and needle in status and "\n" not in status.strip(), status
    status = client.predict("2", "diagonal", api_name="/sweep_batch")[0]
    assert status.startswith("⚠") and "\n" not in status.strip()


def test_a_race_recosted_as_a_batch(client):
    result = client.predict("def f(x):", lane_a="static", lane_b="threshold", max_new_tokens=8, baseline=True,
                            chat=False, api_name="/compare")
    trace = next(x for x in result if isinstance(x, str) and x.endswith(".csv") and "iterations" in x)
    status, table = client.predict(handle_file(trace), 8, "ragged", "flat:0.1", api_name="/race_batch")
    assert status.startswith("predicted on flat:0.1"), status
    rows = {r[0]: r for r in table["data"]}
    assert rows["autoregressive"][4] == 1.0 and len(rows) == 3
    for args, needle in (((handle_file(trace), 0, "ragged", "flat:0.1"), "out of range"),
                         ((handle_file(trace), 4, "ragged", "/etc/passwd.csv"), "choose flat:C"),
                         ((handle_file(trace), 4, "ragged", "roofline:tpu9"), "unknown device"),
                         ((None, 4, "ragged", "flat:0.1"), "run a race first")):
        status = client.predict(*args, api_name="/race_batch")[0]
        assert status.startswith("⚠") and needle in status and "\n" not in status.strip(), status
