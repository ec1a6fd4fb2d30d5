"""Byte sizes as people write them on a command line: `8GiB`, `512MiB`, `1.5GB`, `123456`; and a budget as given:
a size, or a share of a GPU's memory (`0.9`, `90%`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from memlayout.errors import SettingError, UsageError
from memlayout.format_bytes import human_bytes

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


_FRACTION = re.compile(r"^\s*(?:(\d*\.\d+|\d+\.)|(\d+(?:\.\d+)?)\s*%)\s*$")
"""A share: a bare number with a decimal point (0.9), or a percentage (90%); a bare integer is bytes."""


@dataclass(frozen=True)
class BudgetSpec:
    """A budget as the user gave it: bytes, or a fraction of the target GPU's memory."""

    bytes: int | None = None
    fraction: float | None = None

    def describe(self) -> str:
        if self.fraction is not None:
            return f"{self.fraction:g} of the GPU's memory"
        return f"{human_bytes(self.bytes or 0)} ({self.bytes} bytes)"


def parse_budget(text: str) -> BudgetSpec:
    """The budget's text: a size (`78GiB`, `84899201024`), or a fraction of the GPU's memory (`0.9`, `90%`).

    Raises:
        SettingError: neither.
    """
    match = _FRACTION.match(text)
    if match:
        fraction = float(match.group(1)) if match.group(1) else float(match.group(2)) / 100
        if not 0 < fraction <= 1:
            raise SettingError(f"`budget` {text!r} is not a fraction in (0, 1]",
                               "give a share of the GPU's memory such as 0.9 or 90%, or a size such as 78GiB")
        return BudgetSpec(fraction=fraction)
    try:
        return BudgetSpec(bytes=parse_size(text))
    except UsageError:
        raise SettingError(f"`budget` {text!r} is not a size or a fraction of the GPU's memory",
                           "write a size (8GiB, 512MiB, 1.5GB) or a share of the GPU's memory (0.9, 90%)") from None
