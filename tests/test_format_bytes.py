"""One byte formatter: a count reads the same in the table, the messages and the HTML map."""

from __future__ import annotations

import re

import pytest

from memlayout.format_bytes import human_bytes


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        # 539.25 KiB: a tie that float formatting rounds to even ("539.2") and
        # JavaScript's toFixed rounds up; memlayout rounds half up everywhere.
        (552_192, "539.3 KiB"),
        (-552_192, "-539.3 KiB"),
        # Just under 1 MiB rounds to 1024.0 KiB; the unit moves up instead.
        (1024**2 - 1, "1.0 MiB"),
        (13 * 1024**3 // 4, "3.3 GiB"),  # 3.25 GiB, another exact tie
        (5000 * 1024**3, "5000.0 GiB"),
    ],
)
def test_human_bytes_rounds_half_up_and_never_shows_1024_of_a_unit(count: int, text: str) -> None:
    assert human_bytes(count) == text


def test_the_same_count_prints_the_same_in_every_python_report() -> None:
    """No report module formats bytes itself (a `/ 1024` in an f-string was the second formatter)."""
    from pathlib import Path

    import memlayout

    package = Path(memlayout.__file__).parent
    offenders = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\{[^}]*/\s*(1024|2\s*\*\*\s*(10|20|30))\b", line)
    ]
    assert offenders == []
