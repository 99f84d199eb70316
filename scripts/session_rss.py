"""Peak memory of the app on a CPU deployment through a session that switches every menu (issue 25's goal: under
4 GiB). Starts ``python app.py`` as a Hugging Face CPU Space would run it (``SPACE_ID`` set: its start-up engine only,
visitors limited by address), then, through the API: a race for every lane kind and assistant, the engine menu's
other value, the Sweep on the built-in suite, HumanEval and an uploaded question file under every cost profile.
Prints the app's peak resident memory (VmHWM) and what each step answered.

    PYTHONPATH=. .venv/bin/python scripts/session_rss.py [embedded|tiny]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gradio_client import Client, handle_file

ROOT = Path(__file__).resolve().parents[1]


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(models: str = "embedded") -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DISCO_MODELS": models, "GRADIO_SERVER_PORT": str(port), "SPACE_ID": "disco-lab/session-rss",
           "DISCO_LIMIT_BY_ADDRESS": "0"}  # one local client drives the session
    app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(600):
            try:
                client = Client(url, verbose=False)
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(1)
        steps = []

        def step(name, fn):
            try:
                out = fn()
                answer = out[0] if isinstance(out, (list, tuple)) else out
            except Exception as exc:  # noqa: BLE001 - a refusal is an answer too
                answer = f"refused: {str(exc).splitlines()[-1][:120]}"
            steps.append((name, str(answer).splitlines()[0][:120], round(peak_mib(app.pid))))
            print(steps[-1], flush=True)

        prompt = "def is_prime(n):"
        for lane in ["static", "heuristic", "threshold", "oracle", "adaptive", "entropy", "cumulative", "costaware",
                     "pmin", "lookup", "copy", "auto"]:
            step(f"race {lane}", lambda lane=lane: client.predict(prompt, lane_a=lane, lane_b="threshold",
                                                                   max_new_tokens=32, api_name="/compare"))
        for assistant in ["model", "q4_0", "int8"]:
            step(f"assistant {assistant}", lambda a=assistant: client.predict(
                prompt, lane_a_assistant=a, max_new_tokens=32, api_name="/compare"))
        step("engine torch", lambda: client.predict(prompt, engine="torch", max_new_tokens=16, api_name="/compare"))
        questions = Path(tempfile.mkdtemp()) / "question.jsonl"
        questions.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"{c} question {i}"]}) + "\n"
                                     for i, c in enumerate(["writing", "qa", "writing", "qa"])))
        for profile in ["measured", "flat:0.05"]:
            step(f"sweep builtin {profile}", lambda p=profile: client.predict(
                [], "1,3", "0.4", "10", True, True, 16, p, None, [], "built-in suite", None, 2, 0, api_name="/sweep"))
            step(f"sweep humaneval {profile}", lambda p=profile: client.predict(
                [], "1,3", "0.4", "10", False, False, 16, p, None, [], "HumanEval (164 problems)", None, 2, 0,
                api_name="/sweep"))
            step(f"sweep upload {profile}", lambda p=profile: client.predict(
                [], "1,3", "0.4", "10", False, False, 16, p, None, [], "uploaded file", handle_file(str(questions)), 2,
                0, api_name="/sweep"))
        print(f"peak RSS of the app: {peak_mib(app.pid) / 1024:.2f} GiB over {len(steps)} steps")
    finally:
        app.terminate()
        app.wait(timeout=60)


if __name__ == "__main__":
    main(*sys.argv[1:])
