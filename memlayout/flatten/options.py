"""What `memlayout flatten` is asked to do: shared by the driver and every writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memlayout.flatten.plan import DEFAULT_ALIGN

Progress = Callable[[str, int, int], None]
"""progress(task, done, total): how many bytes of a task ("copy", "verify") are done."""


@dataclass(frozen=True)
class FlattenOptions:
    """What `memlayout flatten` was asked to do."""

    out: str | None
    """Destination; None with `check` (or `in_place`, where it is IN)."""
    device: str = "auto"
    align: int = DEFAULT_ALIGN
    trust: bool = False
    check: bool = False
    in_place: bool = False
    verify: bool = True
    force: bool = False
    """Write into a non-empty output folder, replacing only the files flatten writes."""
