"""A model of PyTorch's CUDA caching allocator: what `memory_allocated` and `memory_reserved` would read.

Every rule here follows `c10/cuda/CUDACachingAllocator.cpp` (the native allocator,
`DeviceCachingAllocator`), with its default settings: no `max_split_size`, no
`roundup_power2_divisions`, no expandable segments. Pure Python, no torch: it replays a
sequence of allocations and frees and counts bytes.

- **Rounding** (`round_size`): a request under 512 bytes takes 512 (`kMinBlockSize`);
  others round up to a multiple of 512. A request of 0 bytes allocates nothing
  (`NativeCachingAllocator::allocate` calls `malloc` only `if (size != 0)`).
- **Pools** (`get_pool`): a rounded size of at most 1 MiB (`kSmallSize`) comes from the
  small pool, anything larger from the large pool; a block never moves between pools.
- **Segments** (`get_allocation_size`): when no cached block fits, one `cudaMalloc`
  of 2 MiB (`kSmallBuffer`) for the small pool, 20 MiB (`kLargeBuffer`) for a request
  under 10 MiB (`kMinLargeAlloc`), and otherwise the request rounded up to 2 MiB
  (`kRoundLarge`).
- **Best fit** (`get_free_block`): the free blocks of a pool are ordered by (stream,
  size, address) (`BlockComparatorSize`); `lower_bound` picks the smallest free block
  at least as large as the request, the lowest address among equals.
- **Streams** (`get_free_block`'s `(*it)->stream != p.stream()`): a request is served only
  by a free block of its own stream, and a new segment belongs to the stream that asked
  for it, so each stream keeps a pool of its own. A freed block goes back to the pool
  of the stream it was allocated on; FSDP2 allocates its all-gather buffers on its
  copy-in stream and its reduce-scatter outputs on its reduce-scatter stream, and
  keeps references (not `record_stream`) until the other streams are done with them,
  so a free is final when it happens. Stream 0 is the default stream.
- **Splitting** (`should_split`, `alloc_found_block`): the request takes the front of
  the block and the rest stays free at the higher address, if the rest is at least 512
  bytes in the small pool, or more than 1 MiB (`kSmallSize`) in the large pool. Not
  split, the whole block is handed out and counts as allocated.
- **Coalescing** (`free_block`, `try_merge_blocks`): a freed block merges with its free
  neighbours in the same segment.
- **Segments are kept** (`release_cached_blocks`): nothing is returned to the driver
  during a step. Only when `cudaMalloc` fails (`malloc`: `alloc_block` ||
  `release_cached_blocks` && `alloc_block`) are the cached segments that are wholly
  free (not split) released, and the allocation tried again; the model does that
  when it is given a capacity.

Statistics follow the source too: `allocated` is the sum of allocated blocks' sizes
(`stats.allocated_bytes`, raised in `alloc_found_block` by `block->size`, lowered in
`free`), `reserved` the sum of segments (`stats.reserved_bytes`, raised in
`alloc_block`, lowered in `release_block`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from memlayout.errors import AllocatorOutOfMemoryError

MIN_BLOCK_SIZE = 512
"""kMinBlockSize: every block is a multiple of 512 bytes."""
SMALL_SIZE = 1 << 20
"""kSmallSize: the largest request the small pool serves, 1 MiB."""
SMALL_BUFFER = 2 << 20
"""kSmallBuffer: the small pool's segments, 2 MiB."""
LARGE_BUFFER = 20 << 20
"""kLargeBuffer: the segment a large request under kMinLargeAlloc gets, 20 MiB."""
MIN_LARGE_ALLOC = 10 << 20
"""kMinLargeAlloc: requests from here on get a segment of their own size."""
ROUND_LARGE = 2 << 20
"""kRoundLarge: a segment of its own is rounded up to 2 MiB."""


def round_size(nbytes: int) -> int:
    """The block size a request of `nbytes` takes (`round_size`, default settings)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def is_small(size: int) -> bool:
    """Whether a rounded size comes from the small pool (`get_pool`)."""
    return size <= SMALL_SIZE


def segment_size(size: int) -> int:
    """The cudaMalloc a rounded size makes when no cached block fits (`get_allocation_size`)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("address", "allocated", "next", "prev", "size", "small", "stream")

    def __init__(self, address: int, size: int, small: bool, stream: int = 0) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.stream = stream
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


@dataclass(frozen=True)
class AllocatorPeaks:
    """What a replay measured."""

    allocated_bytes: int
    """Peak of the allocated blocks' sizes: `torch.cuda.max_memory_allocated()`."""
    reserved_bytes: int
    """Peak of the segments' sizes: `torch.cuda.max_memory_reserved()`."""
    segments: int
    """Segments held at the end."""
    reserved_by_stream: tuple[tuple[int, int], ...] = ()
    """(stream, bytes of its segments) when the reserved peak was reached, for each stream that held any."""


def _ascending_addresses() -> Iterator[int]:
    """Addresses for new segments when no real ones are given: apart, so no two segments touch."""
    address = 1 << 40
    while True:
        yield address
        address += 1 << 40


class CachingAllocator:
    """One device's caching allocator, with the default settings: a pool per stream.

    Args:
        capacity: Bytes the driver can give; None for no limit. With a limit, a
            segment that does not fit releases the wholly free cached segments and
            tries again (`release_cached_blocks`), then raises AllocatorOutOfMemoryError.
        segment_addresses: Where new segments start (a real trace's `segment_alloc`
            addresses, to compare placements); by default far apart.

    Example:
        >>> a = CachingAllocator()
        >>> x = a.malloc(600 * 1024)
        >>> a.allocated, a.reserved
        (614400, 2097152)
    """

    def __init__(self, capacity: int | None = None, segment_addresses: Iterable[int] | None = None) -> None:
        self.capacity = capacity
        self._addresses = iter(segment_addresses) if segment_addresses is not None else _ascending_addresses()
        self._free: dict[tuple[bool, int], list[tuple[int, int]]] = {}
        """Per pool (small?, stream), the free blocks as sorted (size, address): BlockComparatorSize."""
        self._blocks: dict[int, _Block] = {}
        """Every block by its address, free or allocated."""
        self.segments: dict[int, int] = {}
        """Segment address -> size."""
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segment_log: list[tuple[int, int]] = []
        """(address, size) of each cudaMalloc, in order."""
        self._stream_reserved: dict[int, int] = {}
        self.peak_reserved_by_stream: dict[int, int] = {}
        """Each stream's segments when `peak_reserved` was reached."""

    # public ---------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> int | None:
        """Allocate `nbytes` on `stream`; the block's address, or None for 0 bytes (nothing is allocated)."""
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        small = is_small(size)
        block = self._take_free_block(size, small, stream)
        if block is None:
            block = self._grow(size, small, stream)
        if self._should_split(block, size):
            rest = _Block(block.address + size, block.size - size, small, stream)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._blocks[rest.address] = rest
            self._insert_free(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.address

    def free(self, address: int | None) -> None:
        """Free the block at `address` (None: a 0-byte allocation, nothing to do)."""
        if address is None:
            return
        block = self._blocks[address]
        if not block.allocated:
            raise ValueError(f"block at {address:#x} is not allocated")
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._merge(block, neighbour)
        self._insert_free(block)

    def block_size(self, address: int) -> int:
        """The size of the block at `address` (allocated or free)."""
        return self._blocks[address].size

    def reset_peaks(self) -> None:
        """As `torch.cuda.reset_peak_memory_stats()`: the peaks start again from the current figures."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved
        self.peak_reserved_by_stream = dict(self._stream_reserved)

    def release_cached(self) -> None:
        """`release_cached_blocks` (`torch.cuda.empty_cache()`): free every segment that is one free block."""
        for free in self._free.values():
            for size, address in list(free):
                block = self._blocks[address]
                if block.prev is None and block.next is None:
                    self._remove_free(block)
                    del self._blocks[address]
                    del self.segments[address]
                    self.reserved -= size
                    self._stream_reserved[block.stream] -= size

    def peaks(self) -> AllocatorPeaks:
        by_stream = tuple(sorted((stream, size) for stream, size in self.peak_reserved_by_stream.items() if size))
        return AllocatorPeaks(self.peak_allocated, self.peak_reserved, len(self.segments), by_stream)

    def segment_blocks(self) -> list[tuple[int, int, bool, list[tuple[int, int, bool]]]]:
        """Each segment held, by address: (address, size, small pool?, its blocks in address order as (address,
        size, allocated?)), as `torch.cuda.memory_snapshot()` lists them."""
        held = []
        for address, size in sorted(self.segments.items()):
            block: _Block | None = self._blocks[address]
            first = block
            blocks = []
            while block is not None:
                blocks.append((block.address, block.size, block.allocated))
                block = block.next
            assert first is not None
            held.append((address, size, first.small, blocks))
        return held

    def seed_segment(self, address: int, size: int, small: bool, allocated: Iterable[tuple[int, int]],
                     stream: int = 0) -> None:
        """Start from a segment a real allocator already holds: `allocated` are its (address, size) blocks in use;
        the gaps between them are free blocks, coalesced as the allocator keeps them."""
        self._count_segment(address, size, stream)
        pieces: list[tuple[int, int, bool]] = []
        cursor = address
        for start, length in sorted(allocated):
            if start < cursor or start + length > address + size:
                raise ValueError(f"block {start:#x}+{length} does not fit segment {address:#x}+{size}")
            if start > cursor:
                pieces.append((cursor, start - cursor, False))
            pieces.append((start, length, True))
            cursor = start + length
        if cursor < address + size:
            pieces.append((cursor, address + size - cursor, False))
        previous: _Block | None = None
        for start, length, in_use in pieces:
            block = _Block(start, length, small, stream)
            block.prev = previous
            if previous is not None:
                previous.next = block
            self._blocks[start] = block
            if in_use:
                block.allocated = True
                self.allocated += length
            else:
                self._insert_free(block)
            previous = block
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    # the source's private steps -------------------------------------------
    def _take_free_block(self, size: int, small: bool, stream: int) -> _Block | None:
        # get_free_block: lower_bound on (stream, size, address); max_split_size is unlimited by default, so
        # neither of its oversize checks applies.
        free = self._free.get((small, stream), [])
        position = bisect.bisect_left(free, (size, -1))
        if position == len(free):
            return None
        _, address = free.pop(position)
        return self._blocks[address]

    def _grow(self, size: int, small: bool, stream: int) -> _Block:
        """A free block of at least `size` where no cached one fits (alloc_block): a new segment."""
        return self._new_segment(segment_size(size), small, stream)

    def _new_segment(self, size: int, small: bool, stream: int) -> _Block:
        # alloc_block; on failure malloc releases the cached segments and tries once more.
        if self.capacity is not None and self.reserved + size > self.capacity:
            self.release_cached()
            if self.reserved + size > self.capacity:
                raise AllocatorOutOfMemoryError(f"a {size}-byte segment does not fit: {self.reserved} of {self.capacity} reserved")
        address = next(self._addresses)
        block = _Block(address, size, small, stream)
        self._blocks[address] = block
        self.segment_log.append((address, size))
        self._count_segment(address, size, stream)
        return block

    def _count_segment(self, address: int, size: int, stream: int) -> None:
        self.segments[address] = size
        self.reserved += size
        self._stream_reserved[stream] = self._stream_reserved.get(stream, 0) + size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
            self.peak_reserved_by_stream = dict(self._stream_reserved)

    @staticmethod
    def _should_split(block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small:
            return remaining >= MIN_BLOCK_SIZE
        return remaining > SMALL_SIZE

    def _merge(self, block: _Block, neighbour: _Block) -> None:
        # try_merge_blocks: the neighbour leaves the free set and its bytes join the block.
        self._remove_free(neighbour)
        del self._blocks[neighbour.address]
        if neighbour is block.prev:
            del self._blocks[block.address]
            block.address = neighbour.address
            block.prev = neighbour.prev
            if block.prev is not None:
                block.prev.next = block
            self._blocks[block.address] = block
        else:
            block.next = neighbour.next
            if block.next is not None:
                block.next.prev = block
        block.size += neighbour.size

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free.setdefault((block.small, block.stream), []), (block.size, block.address))

    def _remove_free(self, block: _Block) -> None:
        free = self._free[(block.small, block.stream)]
        position = bisect.bisect_left(free, (block.size, block.address))
        if position == len(free) or free[position] != (block.size, block.address):
            raise AssertionError(f"free block {block.address:#x} is not in its pool")
        free.pop(position)


Event = tuple[int, int]
"""(storage id, nbytes) allocates that storage; (storage id, -1) frees it."""
StreamEvent = tuple[int, int, int]
"""(storage id, nbytes, stream) allocates that storage on that stream; (storage id, -1, stream) frees it."""
FREE = -1


def replay(events: Iterable[Event | StreamEvent], *, capacity: int | None = None,
           on_alloc: Callable[[int, int | None], None] | None = None,
           allocator: CachingAllocator | None = None) -> AllocatorPeaks:
    """Replay allocations and frees through a fresh allocator and return its peaks.

    Args:
        events: (storage id, nbytes) to allocate, (storage id, FREE) to free it, in order; a third item is the
            stream an allocation is made on (0, the default stream, without it).
        capacity: The driver's limit, if any (see CachingAllocator), for the allocator made here.
        on_alloc: Called with (storage id, address) after each allocation.
        allocator: A fresh allocator to replay through instead of a CachingAllocator: an
            `expandable_segments.ExpandableAllocator` models `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

    Returns:
        The peaks of allocated and reserved bytes, and the segments held at the end.

    Example:
        >>> peaks = replay([(0, 3 << 20), (1, 12 << 20), (0, FREE)])  # 12 MiB fits the 17 MiB left of 20
        >>> peaks.allocated_bytes >> 20, peaks.reserved_bytes >> 20
        (15, 20)
    """
    if allocator is None:
        allocator = CachingAllocator(capacity=capacity)
    live: dict[int, int | None] = {}
    for storage, nbytes, *stream in events:
        if nbytes == FREE:
            allocator.free(live.pop(storage))
        else:
            live[storage] = address = allocator.malloc(nbytes, stream[0] if stream else 0)
            if on_alloc is not None:
                on_alloc(storage, address)
    return allocator.peaks()
