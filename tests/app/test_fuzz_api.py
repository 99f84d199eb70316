"""Every input of every API endpoint, fuzzed (hypothesis): JSON values of every type and edge (None, lists, objects,
huge and non-finite numbers, unicode, lone surrogates, empty text, paths) sent to ``/compare`` and ``/sweep`` through
raw HTTP and through gradio_client. Whatever arrives, the answer is a result or one line: never an HTTP 500, never a
traceback. Also fuzzed: uploaded cost CSVs and the operator's environment variables."""

from __future__ import annotations

import json
import math
import os
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import app
from disco import limits
from disco.app.visitors import QueueRules
from disco.costs import model as cost_model
from disco.errors import UserError
from disco.models import llama

COMPARE_INPUTS = 16
SWEEP_INPUTS = 14
EXAMPLES = int(os.environ.get("DISCO_FUZZ_EXAMPLES", "1000"))  # per endpoint (raw HTTP); the issue asks >= 2,000 in all
COUNT = {"raw": 0, "client": 0, "file_record_refusals": 0}
GRADIO_FILE_REFUSAL = "validation error for FileData"  # Gradio's own data model refusing a malformed file record

EDGES = st.sampled_from([
    None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 2**70, 1e308, -1e308, 5e-324, 0.5, "", " ", "\n", "0", "-1",
    "nan", "NaN", "inf", "-inf", "1e400", "abc", "\udcff", "\x00", "static:5", "threshold:0.4:20", "auto", "default",
    "torch", "llamacpp", "vulkan", "flat:0.05", "measured", "/etc/passwd", "../../x.csv", "a" * 5000, "🙂" * 50,
    [], [1, 2], ["code-csv-parse"], {}, {"path": "/etc/hosts"}, {"path": "/etc/hosts", "meta": {"_type": "gradio.FileData"}},
])
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40))
VALUES = st.one_of(EDGES, SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=6), SCALARS, max_size=3))


def _payload(values) -> str:
    """The request body: NaN and the infinities as JSON-ish literals (some clients send them), lone surrogates escaped."""
    return json.dumps({"data": values}, allow_nan=True)


def _one_line(message) -> None:
    """One line, or Gradio's own refusal of a malformed file record in a file field (its pydantic report: a few lines,
    no traceback; it comes before any code of ours runs, and is counted)."""
    text = "" if message is None else str(message).strip()
    if GRADIO_FILE_REFUSAL in text:
        COUNT["file_record_refusals"] += 1
        return
    assert len(text.splitlines()) <= 1, text[:2000]


def _check_stream(status: int, text: str) -> None:
    assert status != 500 and "Internal Server Error" not in text, text[:500]
    assert "Traceback" not in text, text[:2000]
    if "event: error" in text:
        data = text.split("event: error", 1)[1].split("data:", 1)[1].strip()
        message = json.loads(data) if data.startswith(("{", '"', "null")) else data
        _one_line(message.get("error") if isinstance(message, dict) else message)
    else:
        assert "event: complete" in text, text[:2000]
        outputs = json.loads(text.split("event: complete", 1)[1].split("data:", 1)[1].strip())
        first = outputs[0] if isinstance(outputs, list) and outputs else ""
        if isinstance(first, str) and first.startswith("⚠"):
            assert len(first.strip().splitlines()) == 1, first


SERVER_ERRORS: list[str] = []  # exceptions our handlers let through to Gradio (it prints their tracebacks)


@pytest.fixture(scope="module")
def url(serve_app, tmp_path_factory):
    import sys
    import traceback

    def record(*args, **kwargs):  # Gradio's queue prints the traceback of an exception a handler let through
        SERVER_ERRORS.append("".join(traceback.format_exception(*sys.exc_info())))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gradio.queueing.traceback.print_exc", record)
        mp.setenv("DISCO_CACHE", str(tmp_path_factory.mktemp("fuzz")))
        mp.setenv("DISCO_MAX_NEW_TOKENS", "16")  # a valid draw runs, and stays short
        mp.setenv("DISCO_SWEEP_MAX_WORK", "2000")
        with serve_app(app.build_demo("tiny"), **app.launch_kwargs()) as u:
            yield u


def _no_server_error() -> None:
    """No exception escaped our handlers: each bad value was refused with a message of ours."""
    assert not SERVER_ERRORS, SERVER_ERRORS[-1][-3000:]


def _raw(url: str, endpoint: str, values: list) -> None:
    with httpx.Client(timeout=300) as http:
        posted = http.post(f"{url}gradio_api/call/{endpoint}", content=_payload(values),
                           headers={"Content-Type": "application/json"})
        assert posted.status_code != 500, posted.text[:500]
        if posted.status_code != 200:  # refused before queueing (a bad body, a malformed file record)
            detail = posted.json().get("detail")
            assert detail is not None and "Traceback" not in str(detail), posted.text[:500]
            _one_line(detail if isinstance(detail, str) else json.dumps(detail))
            COUNT["raw"] += 1
            return
        event = posted.json()["event_id"]
        stream = http.get(f"{url}gradio_api/call/{endpoint}/{event}")
        _check_stream(stream.status_code, stream.text)
    _no_server_error()
    COUNT["raw"] += 1


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(st.lists(VALUES, min_size=COMPARE_INPUTS, max_size=COMPARE_INPUTS))
def test_compare_answers_every_input_with_a_result_or_one_line(url, values):
    _raw(url, "compare", values)


@FUZZ
@given(st.lists(VALUES, min_size=SWEEP_INPUTS, max_size=SWEEP_INPUTS))
def test_sweep_answers_every_input_with_a_result_or_one_line(url, values):
    _raw(url, "sweep", values)


@settings(max_examples=max(50, EXAMPLES // 10), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from(["compare", "sweep"]), st.data())
def test_gradio_client_calls_get_a_result_or_one_line(url, endpoint, data):
    from gradio_client import Client

    n = COMPARE_INPUTS if endpoint == "compare" else SWEEP_INPUTS
    values = data.draw(st.lists(st.one_of(EDGES, SCALARS), min_size=n, max_size=n))
    client = Client(url, verbose=False)
    try:
        result = client.predict(*values, api_name=f"/{endpoint}")
    except (TypeError, ValueError, OSError) as exc:  # refused by the client library itself, before any request
        if "Traceback" in str(exc):
            raise
    except httpx.HTTPStatusError as exc:  # refused when joining the queue; the client library words it itself
        assert exc.response.status_code in (400, 422), str(exc)
        assert "Traceback" not in exc.response.text, exc.response.text[:2000]
    except Exception as exc:  # noqa: BLE001 - the server's answer, as gradio_client raises it
        text = str(exc).strip()
        assert "Traceback" not in text and "500" not in text, text
        if not text.startswith("1 parameter(s) failed validation"):  # the client lists a refusal under a heading
            _one_line(text)
    else:
        first = result[0] if isinstance(result, (list, tuple)) else result
        if isinstance(first, str) and first.startswith("⚠"):
            assert len(first.strip().splitlines()) == 1, first
    _no_server_error()
    COUNT["client"] += 1


def test_at_least_two_thousand_inputs_were_sent():
    """The fuzz tests above ran in this session (they run first in this module): count what they sent."""
    if EXAMPLES < 1000 or not COUNT["raw"]:
        pytest.skip("DISCO_FUZZ_EXAMPLES lowered, or the fuzz tests were not run in this session")
    print(f"fuzz: {COUNT}")
    assert COUNT["raw"] + COUNT["client"] >= 2000, COUNT


CSV_CELLS = st.one_of(st.sampled_from(["target", "assistant", "model", "int8", "step", "prefill", "1", "0", "-3", "inf",
                                       "nan", "1e400", "2.5", "9" * 30, "", "x", "1,2", '"', "\udcff"]),
                      st.text(max_size=8))


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.lists(CSV_CELLS, min_size=0, max_size=6), max_size=6), st.booleans())
def test_an_uploaded_cost_csv_is_a_profile_or_one_line(tmp_path_factory, rows, header):
    path = tmp_path_factory.mktemp("csv") / "costs.csv"
    lines = (["role,precision,kind,tokens,ms"] if header else []) + [",".join(r) for r in rows]
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    try:
        model = cost_model.resolve(cost_model.check_profile(str(path)))
    except UserError as exc:
        assert len(str(exc).strip().splitlines()) == 1 and "Traceback" not in str(exc), str(exc)
    else:
        for n in (1, 2, 5, 40):
            assert math.isfinite(model.target_ms(n)) and model.target_ms(n) > 0


OPERATOR = {"DISCO_RUN_BUDGET_S": limits.Budgets.from_env, "DISCO_MAX_LOOKAHEAD": limits.Budgets.from_env,
            "DISCO_MAX_NEW_TOKENS": limits.Budgets.from_env, "DISCO_SWEEP_MAX_SETTINGS": limits.Budgets.from_env,
            "DISCO_SWEEP_MAX_WORK": limits.Budgets.from_env, "DISCO_QUEUE_MAX": QueueRules.from_env,
            "DISCO_RUNS_PER_VISITOR": QueueRules.from_env, "DISCO_PROXY_HOPS": QueueRules.from_env,
            "DISCO_LIMIT_BY_ADDRESS": QueueRules.from_env, "DISCO_LLAMA_THREADS": llama.threads,
            "DISCO_LLAMA_CTX": llama.n_ctx}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(OPERATOR)), st.one_of(st.sampled_from(["", "0", "-1", "1", "1.5", "1e9", "inf", "nan",
                                                                   "x", "2**63", "99999999999999999999", " 3 "]),
                                                  st.text(alphabet=st.characters(blacklist_categories=["Cs"],
                                                                                 blacklist_characters="\x00"),
                                                          max_size=12)))
def test_an_operator_variable_is_used_or_refused_in_one_line(name, raw):
    old = os.environ.get(name)
    os.environ[name] = raw
    try:
        OPERATOR[name]()
    except UserError as exc:
        text = str(exc)
        assert name in text and len(text.splitlines()) == 1 and re.search(r"expected", text), text
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
