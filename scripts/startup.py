"""The app's start from a warm cache, measured as a user meets it: seconds until the page is served and until the
models are ready (the app's own log line), the process's resident memory then, and the time to first token of a
race (the autoregressive lane's first iteration, from the trace CSV) on a prompt of 48 tokens with the chat template
(``short``, the default) or of 69 (``long``).

Usage: PYTHONPATH=. .venv/bin/python scripts/startup.py [RUNS] [short|long]   (DISCO_* variables pass through)
Run it on a quiet machine: the page, the models and the race share its cores.
"""
import os
import re
import subprocess
import sys
import time
import urllib.request

import pandas as pd

PROMPTS = {"short": "Write a Python function returning the n-th Fibonacci number. Include type hints and a docstring.",
           "long": ("Write a Python function read_rows(path) that reads a CSV file with a header line and returns a list of "
          "dictionaries, converting numeric fields to int or float. Include type hints and a docstring.")}
PORT = 7871


def rss_gib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 2**20


def one_run(prompt: str) -> dict:
    env = {**os.environ, "GRADIO_SERVER_PORT": str(PORT), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    served = ready = None
    lines = []
    try:
        while ready is None:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the app exited: " + "".join(lines[-5:]))
            lines.append(line)
            if served is None:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/", timeout=0.2)
                    served = time.perf_counter() - start
                except OSError:
                    pass
            if "models ready in" in line:
                ready = time.perf_counter() - start
        while served is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/", timeout=1)
                served = time.perf_counter() - start
            except OSError:
                time.sleep(0.05)
        memory = rss_gib(proc.pid)
        from gradio_client import Client

        from disco.app.race_tab import OUTPUT_LABELS

        client = Client(f"http://127.0.0.1:{PORT}/", verbose=False)
        result = client.predict(prompt, lane_a="static", lane_b="threshold", max_new_tokens=16, api_name="/compare")
        trace = pd.read_csv(result[OUTPUT_LABELS.index("iterations_csv")])
        first = trace[trace["iteration"] == 1].set_index("strategy")["elapsed_ms"]
        status = re.sub(r"\s+", " ", result[0])[:200]
        return {"served_s": served, "ready_s": ready, "rss_gib": memory, "ttft_ms": first.to_dict(),
                "prompt_tokens": int(trace["prompt_tokens"].iloc[0]) if "prompt_tokens" in trace else None,
                "engine": trace["engine"].iloc[0] if "engine" in trace else None, "status": status}
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print(one_run(PROMPTS[sys.argv[2] if len(sys.argv) > 2 else "short"]), flush=True)
