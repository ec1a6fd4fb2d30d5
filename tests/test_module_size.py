"""No module of memlayout grows past 450 lines unless a comment at its top says why (CONTRIBUTING.md)."""

from __future__ import annotations

from pathlib import Path

import memlayout

LIMIT = 450
REASON = "Over 450 lines on purpose"
"""The words a module's opening comment uses to say why it is longer."""


def long_modules_without_a_reason(package: Path) -> list[str]:
    """Each module over LIMIT lines whose first 40 lines do not give REASON, as "path: N lines"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > LIMIT and not any(REASON in line for line in lines[:40]):
            found.append(f"{path.relative_to(package.parent)}: {len(lines)} lines")
    return found


def test_every_long_module_says_why_it_is_long() -> None:
    assert long_modules_without_a_reason(Path(memlayout.__file__).parent) == []


def test_a_long_module_without_a_reason_is_named(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "short.py").write_text("x = 1\n" * LIMIT)
    (package / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (package / "long_with_reason.py").write_text(f"# {REASON}: one class.\n" + "x = 1\n" * LIMIT)
    assert long_modules_without_a_reason(package) == [f"pkg/long.py: {LIMIT + 1} lines"]
