"""Each Guide page answers a question: it leads with a command, stays short, and holds no dated history.

A reader who comes with one question finds the command that answers it within the
page's first 40 lines, on a page of at most about 2,000 words. How a figure was
measured and how it moved over time belong on the Evidence pages, in
benchmarks/README.md or in the CHANGELOG, each with its command: a date on a Guide
page is that history leaking in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LEAD_LINES = 40
MAX_WORDS = 2_000
DATE = re.compile(
    r"\b20\d\d-[01]\d-[0-3]\d\b"
    r"|\b(?:January|February|March|April|May|June|July|August|September|October|November|December)"
    r" (?:[0-3]?\d, )?20\d\d\b"
)
COMMAND = re.compile(r"^```console\n\$ memlayout |^\$ memlayout ", flags=re.MULTILINE)


def guide_pages() -> list[str]:
    nav: list[dict[str, Any]] = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    (guide,) = [entry["Guide"] for entry in nav if "Guide" in entry]

    def pages(entries: list[Any]) -> list[str]:
        found = []
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                found += pages(value) if isinstance(value, list) else [value]
        return found

    return pages(guide)


@pytest.mark.parametrize("page", guide_pages())
def test_a_guide_page_leads_with_a_command(page: str) -> None:
    lead = "\n".join((DOCS / page).read_text().splitlines()[:LEAD_LINES])
    assert COMMAND.search(lead), f"{page}: no `$ memlayout ...` command in its first {LEAD_LINES} lines"


@pytest.mark.parametrize("page", guide_pages())
def test_a_guide_page_is_short(page: str) -> None:
    words = len((DOCS / page).read_text().split())
    assert words <= MAX_WORDS, f"{page}: {words} words; move evidence and reference detail to their own pages"


@pytest.mark.parametrize("page", guide_pages())
def test_a_guide_page_holds_no_dated_history(page: str) -> None:
    dates = DATE.findall((DOCS / page).read_text())
    assert dates == [], f"{page}: {dates}; dated history goes to the Evidence pages or the CHANGELOG"
