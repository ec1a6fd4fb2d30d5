"""Byte counts, and counted nouns, as people read them.

This is the one formatter: every report, message and summary calls `human_bytes`,
and the HTML map's script (report/templates/storage_map.js, `bytes`) repeats the
same integer arithmetic, so one count prints the same everywhere. Float formatting
would not do: Python's `f"{539.25:.1f}"` rounds the tie to even ("539.2") where
JavaScript's `toFixed(1)` rounds it up ("539.3"), and 552,192 B is that tie.
"""

from __future__ import annotations

_UNITS = (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3))


def human_bytes(count: int) -> str:
    """1536 -> "1.5 KiB"; exact below 1 KiB; GiB is the largest unit.

    One decimal, rounded half up in integers (552,192 B is 539.25 KiB -> "539.3 KiB"),
    and a unit changes where the rounded value would reach 1024 ("1.0 MiB", never
    "1024.0 KiB").
    """
    if abs(count) < 1024:
        return f"{count} B"
    sign, magnitude = ("-" if count < 0 else ""), abs(count)
    for unit, scale in _UNITS:
        tenths = (magnitude * 10 + scale // 2) // scale
        if tenths < 10240 or unit == "GiB":
            return f"{sign}{tenths // 10}.{tenths % 10} {unit}"
    raise AssertionError("unreachable: GiB takes every count")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """3, "name" -> "3 names"; 1, "name" -> "1 name": counts in reports read as sentences."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"
