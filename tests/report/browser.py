"""Headless Debian chromium, driven by playwright, for the HTML storage map tests.

Playwright launches the system's /usr/bin/chromium (it never downloads a browser
of its own) with a fresh temporary profile (`--user-data-dir`) per launch. The
tests skip, with one line, only where chromium is not installed: `make test`
installs it wherever the machine allows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("MEMLAYOUT_CHROMIUM", "/usr/bin/chromium")
# As root chromium needs --no-sandbox; the rest keeps a test run quiet and offline.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent.parent / ".test-artifacts"


def launch_chromium() -> Iterator[Any]:
    """A headless chromium browser, or a skip when none is installed."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"chromium is not installed at {CHROMIUM} (make test installs it where apt-get can)")
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, path: Path, width: int = 1200, height: int = 900) -> tuple[Any, list[str], list[str]]:
    """The page at `path`, drawn; with every request it made and every script error."""
    page = browser.new_page(viewport={"width": width, "height": height})
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    # A selector, not wait_for_function: once the flag is not set at the first look,
    # playwright polls a string predicate through eval, which the page's own
    # Content-Security-Policy (no 'unsafe-eval') refuses, so that wait failed whenever
    # the machine was slow enough to draw after the first look.
    page.wait_for_selector("body[data-ready='1']", state="attached")
    return page, requests, errors
