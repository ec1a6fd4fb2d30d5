"""The built documentation site in a real browser: opened from disk, and read at 1280 px.

The site is what `make docs` builds (`mkdocs build --strict`). `make docs` runs
these tests on the site it built (MEMLAYOUT_SITE=site); elsewhere they build one
into a temporary folder, and skip with one line where the docs extra (mkdocs) or
chromium is not installed. Every page is checked, so a new page is covered too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.report.browser import launch_chromium

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 1280


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("MEMLAYOUT_SITE")
    if built:
        return Path(built).resolve()
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make docs installs it)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch_chromium()


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "search" not in p.relative_to(site).parts)


def test_every_link_of_every_page_opens_a_page_from_disk(site: Path, browser: Any) -> None:
    """Opened from disk (file://), a directory URL shows a directory listing: every link the
    site makes to itself names an HTML file that exists, and every stylesheet and script it
    loads is there. 404.html too: mkdocs writes its links from "/", the filesystem's root."""
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    broken: list[str] = []
    for html in pages(site):
        page.goto(html.as_uri())
        for href in page.evaluate(
            "() => [...document.querySelectorAll('a[href], link[href], script[src]')].map(e => e.href || e.src)"
        ):
            if not href.startswith("file://"):
                continue
            target = Path(href.removeprefix("file://").split("#")[0].split("?")[0])
            if not target.is_file():
                broken.append(f"{html.relative_to(site)} -> {href}")
    assert broken == [], broken[:10]
    # The 404 page's own links and look work from disk: its navigation reaches the pages.
    page.goto((site / "404.html").as_uri())
    assert page.evaluate("() => getComputedStyle(document.querySelector('.md-header')).position") == "sticky"
    page.locator("nav.md-nav--primary a.md-nav__link", has_text="Usage").first.click()
    page.wait_for_load_state()
    assert page.url.endswith("/usage.html")
    # And a click in the navigation lands on the page, not on a listing.
    page.goto((site / "index.html").as_uri())
    page.locator("nav.md-nav--primary a.md-nav__link", has_text="Usage").first.click()
    page.wait_for_load_state()
    assert page.url.endswith("/usage.html")
    assert page.title().startswith("Usage")


def test_no_example_block_or_table_is_clipped_at_1280_px(site: Path, browser: Any) -> None:
    """Every code block and table shows its whole width in a 1280 px window: nothing hides
    past the right edge behind a scrollbar."""
    page = browser.new_page(viewport={"width": WIDTH, "height": 900})
    clipped: list[str] = []
    for html in pages(site):
        page.goto(html.as_uri())
        for text in page.evaluate(
            """() => [...document.querySelectorAll(
                   '.md-content pre > code, .md-content .md-typeset__scrollwrap, .md-content table')]
                 .filter(e => e.scrollWidth > e.clientWidth + 1)
                 .map(e => `${e.tagName} ${e.scrollWidth}>${e.clientWidth}: ${e.textContent.trim().slice(0, 60)}`)"""
        ):
            clipped.append(f"{html.relative_to(site)}: {text}")
    assert clipped == [], clipped[:10]
