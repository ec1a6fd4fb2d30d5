"""Byte sizes as people write them on a command line: `8GiB`, `512MiB`, `1.5GB`, `123456`."""

from __future__ import annotations

import re

from memlayout.errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """`8GiB` -> 8589934592. Decimal units (GB) are powers of 1000, binary ones (GiB, G) of 1024.

    Args:
        text: A number of bytes, optionally with a unit.

    Returns:
        The size in whole bytes (rounded down).

    Raises:
        UsageError: the text is not a size.
    """
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(f"{text!r} is not a size", "write bytes or a unit, e.g. 8GiB, 512MiB, 1.5GB")
    return int(float(match.group(1)) * _UNITS[unit])
