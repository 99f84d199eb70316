"""A module-scoped app (tiny preset) and a module-scoped Debian Chromium driven by Playwright.

Module, not session: the app's fixture points ``DISCO_CACHE`` at an empty folder while it runs, and a session-scoped
one kept it there for every later test of the session (integration and unit): without the linked prepared models
(tests/conftest.py), the fp32 real pair was joined and converted again, 115-141 s instead of 18-20 s."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, serve_app):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    import app

    # the Sweep tab caches replay tables between sessions: start from an empty cache so every run computes
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISCO_CACHE", str(tmp_path_factory.mktemp("replay-cache")))
        with serve_app(app.build_demo("tiny"), **app.launch_kwargs()) as url:
            yield url


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.goto(app_url)
    page.wait_for_selector("#run")
    page.wait_for_selector("#disco-status:has-text('Models ready')", timeout=120_000)
    try:
        yield page
    finally:
        context.close()
