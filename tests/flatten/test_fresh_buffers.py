"""Filling fresh buffers fast (pages faulted in ahead, bytes moved as words) changes speed, never contents."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest
import torch

from memlayout.flatten import populate as populate_module
from memlayout.flatten.apply import allocate, word_size, words
from memlayout.flatten.plan import FlatBuffer, FlatPlan
from memlayout.flatten.populate import populate


def _resident_pages(address: int, length: int) -> int:
    """How many of the range's pages the kernel has mapped in, by mincore(2).

    Asked of the buffer's own pages, not the process's RSS: other threads, the
    garbage collector and malloc's reuse of resident heap all move RSS too.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    pages = (ctypes.c_ubyte * (length // mmap.PAGESIZE))()
    if libc.mincore(address, length, pages) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(page & 1 for page in pages)


def test_populate_keeps_the_bytes_of_an_unaligned_slice() -> None:
    # 40 MiB: split over two threads where torch has two; offset 3 so neither end is page-aligned.
    whole = torch.arange(40 << 20, dtype=torch.int64).to(torch.uint8)
    expected = whole.clone()
    populate(whole[3 : (40 << 20) - 5])
    assert torch.equal(whole, expected)


def test_populate_accepts_buffers_smaller_than_a_page() -> None:
    tiny = torch.full((100,), 7, dtype=torch.uint8)
    populate(tiny[1:])
    populate(torch.empty(0, dtype=torch.uint8))
    assert torch.equal(tiny, torch.full((100,), 7, dtype=torch.uint8))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux-only")
def test_populate_maps_a_fresh_buffer_before_anything_writes_it() -> None:
    # A private anonymous mapping nothing has touched: none of its pages exist yet,
    # whatever malloc and the rest of the test run have done before.
    length = 64 << 20
    region = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    fresh = torch.frombuffer(region, dtype=torch.uint8)
    address = fresh.data_ptr()
    try:
        assert _resident_pages(address, length) == 0
        populate(fresh)
        if not populate_module._supported:
            pytest.skip("this kernel predates MADV_POPULATE_WRITE (Linux 5.14)")
        assert _resident_pages(address, length) == length // mmap.PAGESIZE
    finally:
        del fresh
        region.close()


def test_allocate_still_zeroes_padding_when_pages_come_from_a_reused_heap() -> None:
    # Small buffers come from malloc's heap, whose pages may hold old bytes:
    # populate leaves those bytes, so the gaps must still be zeroed explicitly.
    garbage = [torch.full((4096,), 0xAB, dtype=torch.uint8) for _ in range(64)]
    del garbage
    plan = FlatPlan((FlatBuffer("tensors uint8 cpu", ("", "tensor", "cpu", "uint8", ""), "cpu", "uint8", 4096,
                                ()),), 64)
    (buffer,) = allocate(plan)
    assert int(buffer.count_nonzero()) == 0


def test_byte_copies_use_the_widest_words_every_address_offset_and_length_allows() -> None:
    assert word_size(4096, 64, 128, 1024) == 8
    assert word_size(4096, 64, 4, 1024) == 4
    assert word_size(4096, 66, 128, 1024) == 2
    assert word_size(4096, 64, 128, 1023) == 1


def test_words_view_exactly_the_bytes_asked_for() -> None:
    storage = torch.arange(64, dtype=torch.int64).to(torch.uint8).untyped_storage()
    view = words(storage, 8, 16, torch.int32, torch.device("cpu"))
    assert view.shape == (4,)
    assert bytes(view.view(torch.uint8).tolist()) == bytes(range(8, 24))
