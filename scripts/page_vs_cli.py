"""The page's headline against the command line's on the same prompt and machine (issue 27's goal: within 10 %), and
the README's screenshot. Runs, in turn: ``python -m disco generate`` (no browser), then the same race from the page
in Debian's Chromium on this machine (``python app.py`` on the embedded pair, Playwright clicking Run), then the
command line again; prints each one's speed-ups, the page's status line (which says whether its figures are live or
from the quiet pass costs) and the ratios. ``--screenshot`` also saves the page as docs/screenshot.png.

    PYTHONPATH=. .venv/bin/python scripts/page_vs_cli.py [--screenshot] [--reps N]
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a Python function is_prime(n) that returns True when n is a prime number."  # the page's first example
LANES = ["autoregressive", "static:5", "threshold:0.4:20"]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def cli() -> dict[str, float]:
    cmd = [sys.executable, "-m", "disco", "generate", "--prompt", PROMPT, "--chat", "--max-new-tokens", "64", "--json"]
    for lane in LANES:
        cmd += ["--strategy", lane]
    rows = [json.loads(line) for line in subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                                         check=True).stdout.splitlines()]
    return {r["strategy"]: r["speedup"] for r in rows}


def page(url: str, shot: Path | None) -> tuple[dict[str, float], str]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        tab = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
        tab.goto(url)
        tab.wait_for_selector("#disco-status:has-text('Models ready')", timeout=300_000)
        tab.locator("#prompt textarea").fill(PROMPT)
        tab.click("#run")
        tab.wait_for_selector("#run-status:has-text('Done')", timeout=600_000)
        status = tab.locator("#run-status").inner_text()
        if shot is not None:
            tab.mouse.move(0, 0)
            tab.wait_for_timeout(1500)
            tab.screenshot(path=str(shot), full_page=True)
        browser.close()
    headline = status.split(" (from")[0].split(" (live")[0]  # the figures the page leads with, not the live ones beside
    found = dict(re.findall(r"(static:5|threshold:0\.4:20) ([0-9.]+)×", headline))
    return {k: float(v) for k, v in found.items()}, status


def main() -> None:
    shot = ROOT / "docs" / "screenshot.png" if "--screenshot" in sys.argv else None
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port)}
    app = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(reps):
            before = cli()
            shown, status = page(f"http://127.0.0.1:{port}/", shot)
            after = cli()
            print(f"command line before: {before}")
            print(f"page headline:       {shown}")
            print(f"command line after:  {after}")
            for lane in shown:
                base = (before[lane] + after[lane]) / 2
                print(f"  {lane}: page / command line = {shown[lane] / base:.3f}")
            print("page status:", " ".join(status.split()))
            time.sleep(1)
    finally:
        app.terminate()
        app.wait(timeout=120)


if __name__ == "__main__":
    main()
