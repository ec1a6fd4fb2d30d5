"""Byte counts as people read them."""

from __future__ import annotations


def human_bytes(count: int) -> str:
    """1536 -> "1.5 KiB"; exact below 1 KiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
