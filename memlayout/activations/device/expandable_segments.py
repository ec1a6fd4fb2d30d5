"""The caching allocator with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: one growing segment per pool and stream.

What changes from the default (cuda_allocator.py), each as c10/cuda/CUDACachingAllocator.cpp does it:
- **Growing, not new segments** (`alloc_block` -> `try_allocate_expandable_block`): where no
  cached free block fits, the pool's expandable segment for the stream (a virtual range as
  large as the device, `ExpandableSegment`) maps more physical memory at its end, in pages
  of 2 MiB for the small pool and 20 MiB for the large one (`kSmallBuffer`, `kLargeBuffer`),
  just enough for the request (`map_block(candidate, min(candidate->size, size))`), and a
  free block at the end of what is mapped is grown into it (`find_expandable_block` starts
  from the free block before the unmapped range).
- **Splitting** (`should_split`): any rest of 512 bytes or more is split off, in the large
  pool too.
- **Reserved** is what is mapped (`map_block` raises `reserved_bytes` by the range mapped):
  nothing is unmapped during a step; a free block in the middle of a segment stays mapped,
  and serves only a request it fits, as in the default allocator.
- **On a full device** (`release_cached_blocks`), free memory at the end of each segment is
  unmapped before mapping is tried again (the source also unmaps the pages inside free
  blocks within the segment; that is not modelled, so near the limit this model can read
  more reserved than the allocator).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from memlayout.activations.device.cuda_allocator import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    _Block,
)
from memlayout.errors import AllocatorOutOfMemoryError

MIN_SPLIT = 512
"""`should_split` with expandable segments: a rest of kMinBlockSize or more is split off, in every pool."""


def _pages(size: int, page: int) -> int:
    return -(-size // page) * page


class ExpandableAllocator(CachingAllocator):
    """`CachingAllocator` with expandable segments (see the module's docstring).

    Example:
        >>> a = ExpandableAllocator()
        >>> x = a.malloc(30 << 20)  # 30 MiB maps two 20 MiB pages: 10 MiB stay free at the end
        >>> y = a.malloc(15 << 20)  # 5 more MiB are mapped onto the free 10: one more page
        >>> a.reserved >> 20, a.allocated >> 20
        (60, 45)
    """

    def __init__(self, capacity: int | None = None, segment_addresses: Iterable[int] | None = None) -> None:
        super().__init__(capacity, segment_addresses)
        self._last: dict[tuple[bool, int], _Block | None] = {}
        """Per pool and stream, the block at the end of what its segment has mapped."""
        self._ends: dict[tuple[bool, int], tuple[int, int]] = {}
        """Per pool and stream, (the segment's base address, the end of what is mapped)."""

    def malloc(self, nbytes: int, stream: int = 0) -> int | None:
        address = super().malloc(nbytes, stream)
        if address is not None:
            block = self._blocks[address]
            key = (block.small, block.stream)
            if self._last.get(key) is block and block.next is not None:
                self._last[key] = block.next  # the rest split off the end block is the end now
        return address

    def _grow(self, size: int, small: bool, stream: int) -> _Block:
        key = (small, stream)
        page = SMALL_BUFFER if small else LARGE_BUFFER
        if key not in self._ends:
            base = next(self._addresses)
            self._ends[key] = (base, base)
            self._last[key] = None
        base, end = self._ends[key]
        last = self._last[key]
        tail_free = last is not None and not last.allocated
        mapped = _pages(size - (last.size if tail_free and last is not None else 0), page)
        self._map(mapped, stream)
        if tail_free and last is not None:
            self._remove_free(last)
            last.size += mapped
            block = last
        else:
            block = _Block(end, mapped, small, stream)
            block.prev = last
            if last is not None:
                last.next = block
            self._blocks[end] = block
            self._last[key] = block
        self._ends[key] = (base, end + mapped)
        self.segments[base] = self.segments.get(base, 0) + mapped
        self.segment_log.append((end, mapped))
        return block

    def _map(self, mapped: int, stream: int) -> None:
        if self.capacity is not None and self.reserved + mapped > self.capacity:
            self.release_cached()
            if self.reserved + mapped > self.capacity:
                raise AllocatorOutOfMemoryError(
                    f"{mapped} bytes more do not map: {self.reserved} of {self.capacity} reserved")
        self.reserved += mapped
        self._stream_reserved[stream] = self._stream_reserved.get(stream, 0) + mapped
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.peak_reserved_by_stream = dict(self._stream_reserved)

    def _merge(self, block: _Block, neighbour: _Block) -> None:
        key = (block.small, block.stream)
        if self._last.get(key) is neighbour and neighbour is block.next:
            self._last[key] = block  # the block takes the neighbour's place at the end
        super()._merge(block, neighbour)

    @staticmethod
    def _should_split(block: _Block, size: int) -> bool:
        return block.size - size >= MIN_SPLIT

    def release_cached(self) -> None:
        """Unmap the free block at the end of each segment (see the module's docstring)."""
        for key, last in list(self._last.items()):
            if last is None or last.allocated:
                continue
            self._remove_free(last)
            del self._blocks[last.address]
            base, end = self._ends[key]
            self._ends[key] = (base, end - last.size)
            self.segments[base] -= last.size
            self.reserved -= last.size
            self._stream_reserved[last.stream] -= last.size
            self._last[key] = last.prev
            if last.prev is not None:
                last.prev.next = None


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


class AllocatorConfig(NamedTuple):
    """The caching allocator's settings a step runs with, as far as the model follows them."""

    expandable_segments: bool = False
    unmodelled: tuple[str, ...] = ()
    """Settings given that the model does not follow (max_split_size_mb, roundup_power2_divisions, ...)."""


def allocator_config(environ: Mapping[str, str] | None = None) -> AllocatorConfig:
    """`PYTORCH_CUDA_ALLOC_CONF` of the environment the step will run in (this process's by default), as
    c10's `CUDAAllocatorConfig::parseArgs` reads it: comma-separated `key:value` pairs."""
    text = (os.environ if environ is None else environ).get(ALLOC_CONF, "")
    expandable = False
    unmodelled: list[str] = []
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = pair.partition(":")
        if key.strip() == "expandable_segments":
            expandable = value.strip().lower() == "true"
        else:
            unmodelled.append(pair)
    return AllocatorConfig(expandable, tuple(unmodelled))
