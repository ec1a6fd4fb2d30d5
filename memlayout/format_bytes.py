"""Byte counts as people read them."""

from __future__ import annotations


def human_bytes(count: int) -> str:
    """1536 -> "1.5 KiB"; exact below 1 KiB; GiB is the largest unit."""
    if abs(count) < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB"):
        value /= 1024
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} GiB"
