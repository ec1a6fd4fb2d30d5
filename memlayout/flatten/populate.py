"""Fault a fresh CPU buffer's pages in before it is filled, on every intra-op thread.

Filling a freshly allocated buffer is bound by page faults, not by the copy: each
first write to a 4 KiB page traps into the kernel, which zeroes the page and maps
it. `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+) does the same work for a whole
range in one call with no trap per page; split over the intra-op threads, it and
the copy that follows at memory speed together beat faulting inside the copy
(bench_flatten.py; the figures are in benchmarks/README.md). One thread alone was
slower than faulting inside a two-thread copy, so the range is always split. Where the call is missing or refused, the
copy faults the pages in as before: this only ever changes speed.
"""

from __future__ import annotations

import mmap
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MADV_POPULATE_WRITE = 23
"""From linux/mman.h; Python's mmap module does not export it before 3.13."""
MIN_PART_BYTES = 16 << 20
"""Below this a thread's start-up costs more than the faults it would take over."""
MAX_PARTS = 16
"""Past this many threads the kernel's page-table locks, not cores, are the limit."""

_madvise: Any = None
_supported = sys.platform.startswith("linux")


def _madvise_function() -> Any:
    import ctypes

    global _madvise
    if _madvise is None:
        function = ctypes.CDLL(None, use_errno=True).madvise
        function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        function.restype = ctypes.c_int
        _madvise = function
    return _madvise


def _populate_range(start: int, length: int) -> None:
    import ctypes

    global _supported
    # ctypes releases the GIL for the call, so the parts fault in parallel.
    if _madvise_function()(start, length, MADV_POPULATE_WRITE) != 0 and ctypes.get_errno() == 22:
        _supported = False  # EINVAL: a kernel older than 5.14; stop asking.


def populate(buffer: torch.Tensor) -> None:
    """Map every whole page of a contiguous CPU tensor writable now, in parallel.

    Args:
        buffer: A contiguous CPU tensor, typically just allocated. Its contents are
            kept: pages already present are left as they are.
    """
    import torch

    if not _supported or buffer.device.type != "cpu" or buffer.is_pinned():
        return
    page = mmap.PAGESIZE
    address = buffer.data_ptr()
    start = -(-address // page) * page
    end = (address + buffer.numel() * buffer.element_size()) // page * page
    if end <= start:
        return
    parts = max(1, min(torch.get_num_threads(), MAX_PARTS, (end - start) // MIN_PART_BYTES))
    step = -(-(end - start) // parts // page) * page
    bounds = [(low, min(low + step, end)) for low in range(start, end, step)]
    threads = [threading.Thread(target=_populate_range, args=(low, high - low)) for low, high in bounds[1:]]
    for thread in threads:
        thread.start()
    _populate_range(bounds[0][0], bounds[0][1] - bounds[0][0])
    for thread in threads:
        thread.join()
