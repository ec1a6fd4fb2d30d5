"""Pausing CPython's cyclic garbage collector: the one place memlayout does it.

Reading a checkpoint allocates a few containers per tensor (records, facts) and
keeps them all until the report is written, and none of them forms a cycle. The
collector runs whenever allocations outnumber frees by 700, and its older
generations traverse every container allocated since: at 40,000 tensors that was
40% of an inspection's time (benchmarks/README.md). Reference counting still frees
everything as usual, and a cycle made meanwhile (a hostile pickle can make some)
waits for the next collection after the pause.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The collector off inside the block, and back on after it; if it was already off, it stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
