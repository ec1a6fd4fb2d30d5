"""docs/reliability.md stays true to the repository: its commands and test files exist, and the README links it."""

from __future__ import annotations

import re
from pathlib import Path


def test_every_command_and_test_the_reliability_page_names_exists(repo_root: Path) -> None:
    page = (repo_root / "docs" / "reliability.md").read_text()
    makefile = (repo_root / "Makefile").read_text()
    for target in set(re.findall(r"`make (\w+)`", page)):
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"make {target}"
    for path in set(re.findall(r"`(?:pytest )?(tests/[\w/]+\.py)", page)):
        assert (repo_root / path).exists(), path
    assert "docs/reliability.md" in (repo_root / "README.md").read_text()
    assert "2026-11-22" in page  # every figure carries the date it was measured
