"""The first start from nothing, timed as a user meets it (issue 35): a fresh clone of this checkout, an empty cache
(``DISCO_CACHE``, so no kept llama.cpp wheel and no joined model files) and pip's cache off, then ``./run.sh`` until
the page is served and the embedded pair is ready; then, from that cache, a second start. Prints each part from the
lines the set-up and the app print (the progress line's "done in", the app's "models ready in").

Usage: .venv/bin/python scripts/first_start.py [WORKDIR]   (default /tmp/disco-first-start; removed first)
Run it on a quiet machine: pip, the build and the app share its cores. It downloads ~2 GB.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PORT = 7873
ROOT = Path(__file__).resolve().parents[1]


def start(clone: Path, env: dict) -> dict:
    """``./run.sh`` in ``clone`` until the models are ready; the seconds at which each part ended."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(["./run.sh"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    marks, log = {}, []
    try:
        for line in proc.stdout:
            now = time.perf_counter() - t0
            log.append(f"{now:7.1f}  {line.rstrip()}")
            print(log[-1], flush=True)
            for name, pattern in (("install", r"install done in"), ("build", r"llama\.cpp build done in"),
                                  ("built", r"setup: built "), ("app", r"DISCO Lab: loading"),
                                  ("ready", r"models ready in")):
                if name not in marks and re.search(pattern, line):
                    marks[name] = now
            if "app" in marks and "served" not in marks:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/", timeout=0.5)
                    marks["served"] = time.perf_counter() - t0
                except OSError:
                    pass
            if "ready" in marks:
                break
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if "ready" not in marks:
        raise SystemExit("first_start: the app never said its models were ready:\n" + "\n".join(log[-20:]))
    return marks


def main() -> int:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/disco-first-start")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "DISCO_CACHE": str(work / "cache"), "PIP_NO_CACHE_DIR": "1", "GRADIO_SERVER_PORT": str(PORT),
           "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    flags = sorted(f for f in open("/proc/cpuinfo").read().split("\n\n")[0].split("flags")[1].split(":")[1].split()
                   if f.startswith(("avx", "amx")))
    print(f"first_start: {os.cpu_count()} cores, CPU flags {' '.join(flags)}", flush=True)
    first = start(clone, env)
    second = start(clone, env)
    print("\nfirst start, nothing cached (s): " + ", ".join(f"{k} {v:.0f}" for k, v in first.items()))
    print("second start, from the cache (s): " + ", ".join(f"{k} {v:.1f}" for k, v in second.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
