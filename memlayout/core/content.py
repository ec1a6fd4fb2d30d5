"""Reading tensor contents through a loader's `StorageReader`, in logical order.

Rules that look at values (ML102 duplicates, ML503 non-finite) go through here, so
they read only what they need: one small probe and a few sampled elements per
duplicate candidate, the full contents of tensors whose samples match, or, with
--deep, every floating tensor once, streamed in cache-sized chunks.

Streaming keeps memory bounded. Mapped file pages count in the process's RSS once
touched, so a reader that maps its file may offer `release(storage_key, start,
length)`, and every chunk is released once the next one is asked for; a reader
that can also `read_into(storage_key, start, buffer)` lets the non-finite scan copy
into a reused buffer instead, mapping nothing. numpy is imported only when values
are actually read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from memlayout.core.facts import TensorFact
from memlayout.core.strides import element_span, has_internal_overlap
from memlayout.dtypes import dtype_info
from memlayout.load.records import StorageReader

if TYPE_CHECKING:
    import numpy as np

    from memlayout.core.facts import Facts
    from memlayout.load.records import LoadedSource

# 4 MiB chunks stay in the last-level cache, so the masked copy and the reduction a
# scan runs over one chunk read main memory once, while per-chunk overhead (a map
# slice, a madvise) stays small. The size was chosen by measuring 1, 4 and 16 MiB
# with bench_deep.py (figures in benchmarks/README.md).
DEFAULT_CHUNK_BYTES = 4 << 20
PROBE_BYTES = 64
MAX_SCAN_THREADS = 4
SCAN_BATCH_BYTES = 16 << 20

_UINT_FOR_ITEMSIZE = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def _element_offset(tensor: TensorFact, flat_index: int) -> int:
    offset = tensor.offset
    for size, step in zip(reversed(tensor.shape), reversed(tensor.stride), strict=True):
        flat_index, index = divmod(flat_index, size)
        offset += index * step
    return offset


def _words(chunk: np.ndarray) -> np.ndarray:
    # Elements wider than 8 bytes (complex128) have no numpy uint; their 8-byte
    # words serve the fingerprint just as well.
    return chunk.view("<u8") if chunk.dtype.kind == "V" else chunk


def content_reader(source: LoadedSource, facts: Facts) -> ContentReader | None:
    """The reader of the values of `facts`' tensors, built from `source`; None when the source cannot read them.

    Facts name storages by id, a loader's reader by its own key (a zip record, a
    file offset): the storage facts map one to the other.
    """
    if source.reader is None:
        return None
    return ContentReader(source.reader, {storage.id: storage.key for storage in facts.storages})


class ContentReader:
    """Reads the values of tensors described by facts."""

    def __init__(
        self,
        reader: StorageReader,
        storage_keys: dict[str, str],
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.reader = reader
        self.storage_keys = storage_keys
        self.chunk_bytes = chunk_bytes
        self._release: Callable[[str, int, int], None] | None = getattr(reader, "release", None)
        self._read_into: Callable[[str, int, memoryview], None] | None = getattr(reader, "read_into", None)
        self._checksum: Callable[[str, int, int], int | None] | None = getattr(reader, "checksum", None)
        self._local = threading.local()

    def _key(self, tensor: TensorFact) -> str:
        return self.storage_keys[tensor.storage]

    def recorded_checksum(self, tensor: TensorFact) -> int | None:
        """The CRC-32 the file records for this tensor's bytes, read from metadata alone; None if unknown.

        A torch.save zip keeps a CRC-32 of every storage record in its directory, so
        two tensors that each fill their whole storage and whose CRCs differ are
        proven different without reading a byte of either. The reader answers only
        for a whole record: the CRC says nothing about part of one.
        """
        if self._checksum is None or not tensor.contiguous:
            return None
        return self._checksum(self._key(tensor), tensor.offset * tensor.itemsize, tensor.nbytes)

    def probe(self, tensor: TensorFact) -> bytes:
        """Up to 64 bytes from the middle of the tensor: one read, to rule out most non-duplicates.

        Trained weights differ almost everywhere, so this settles nearly every ML102
        candidate with a single small read; only tensors that agree here (constant
        ones, real copies) go on to `sample` and then to a full comparison.
        """
        if tensor.numel == 0:
            return b""
        size = tensor.itemsize
        count = max(1, min(tensor.numel, PROBE_BYTES // size))
        first = (tensor.numel - count) // 2
        key = self._key(tensor)
        if tensor.contiguous:
            return bytes(self.reader.read(key, (tensor.offset + first) * size, count * size))
        # The same logical elements, element by element: equal tensors must probe
        # equal whatever their strides.
        return b"".join(
            bytes(self.reader.read(key, _element_offset(tensor, index) * size, size))
            for index in range(first, first + count)
        )

    def sample(self, tensor: TensorFact, count: int = 16) -> bytes:
        """`count` elements at evenly spaced logical positions, first and last included.

        Cheap by design: `count` tiny reads, whatever the tensor's size.
        """
        if tensor.numel == 0:
            return b""
        count = min(count, tensor.numel)
        step = (tensor.numel - 1) / max(count - 1, 1)
        picks = sorted({round(i * step) for i in range(count)})
        size = tensor.itemsize
        key = self._key(tensor)
        return b"".join(
            bytes(self.reader.read(key, _element_offset(tensor, index) * size, size)) for index in picks
        )

    def array(self, tensor: TensorFact) -> np.ndarray:
        """The whole tensor as unsigned integers of its item width, logical order, read-only.

        Bit patterns, not values: equal arrays mean bitwise-equal tensors. Maps the
        whole tensor at once; scans should prefer `chunks`, which bound memory.
        """
        import numpy as np

        first, end = element_span(tensor.shape, tensor.stride, tensor.offset)
        size = tensor.itemsize
        raw = self.reader.read(self._key(tensor), first * size, (end - first) * size)
        flat = np.frombuffer(raw, dtype=_item_dtype(size))
        if tensor.contiguous:
            return flat.reshape(tensor.shape)
        return np.lib.stride_tricks.as_strided(
            flat, shape=tensor.shape, strides=tuple(s * size for s in tensor.stride), writeable=False
        )

    def chunks(self, tensor: TensorFact, chunk_bytes: int | None = None) -> Iterator[np.ndarray]:
        """The tensor's elements (as unsigned bit patterns), in logical order, in pieces of about `chunk_bytes`.

        Contiguous tensors stream straight from the reader. Strided ones are split
        along their outermost dims in memory (the largest strides), so a transposed
        weight is read column by column in address order rather than jumping over
        the whole tensor for every row. Each piece's mapped pages are released when
        the next piece is asked for.
        """
        import numpy as np

        chunk_bytes = chunk_bytes or self.chunk_bytes
        size = tensor.itemsize
        item = _item_dtype(size)
        key = self._key(tensor)
        if tensor.numel == 0:
            return
        if tensor.contiguous:
            start = tensor.offset * size
            remaining = tensor.nbytes
            step = max(chunk_bytes // size, 1) * size
            while remaining > 0:
                length = min(step, remaining)
                yield np.frombuffer(self.reader.read(key, start, length), dtype=item)
                if self._release is not None:
                    self._release(key, start, length)
                start += length
                remaining -= length
            return
        # A strided view's bytes are spread over its whole span (a transposed weight
        # has neighbouring elements a row apart), so the span is mapped once and cut
        # into blocks of leading indices; each block is gathered into a chunk-sized
        # copy in logical order. The span is released when the tensor is done: at most
        # one tensor's pages are resident, which is the bound --deep promises.
        first, end = element_span(tensor.shape, tensor.stride, tensor.offset)
        raw = self.reader.read(key, first * size, (end - first) * size)
        view = np.lib.stride_tricks.as_strided(
            np.frombuffer(raw, dtype=item),
            shape=tensor.shape,
            strides=tuple(s * size for s in tensor.stride),
            writeable=False,
        )
        yield from _blocks(view, max(chunk_bytes // size, 1))
        if self._release is not None:
            self._release(key, first * size, (end - first) * size)

    def non_finite(self, tensor: TensorFact) -> int:
        """How many NaN/Inf elements the tensor holds (0 for non-floating dtypes), in one streaming pass."""
        info = dtype_info(tensor.dtype)
        if not info.is_floating or tensor.numel == 0:
            return 0
        counter = _NonFiniteCounter(info.special_mask, info.special_pattern)
        if tensor.self_overlapping:
            return self._overlapping_non_finite(tensor, counter)
        if tensor.contiguous and self._read_into is not None:
            return sum(counter.count(chunk) for chunk in self._buffered_chunks(tensor))
        return sum(counter.count(chunk) for chunk in self.chunks(tensor))

    def _overlapping_non_finite(self, tensor: TensorFact, counter: _NonFiniteCounter) -> int:
        # A view whose indices share elements (expand's zero strides, or windows)
        # can name 2**40 elements of a few bytes; walking them all never ends (a
        # fuzzed tar file did exactly that). Zero-stride dims repeat what the rest
        # holds, so the rest is counted once and multiplied; windows that still
        # overlap are counted over the memory they cover, each element once.
        import numpy as np


        kept = [(size, step) for size, step in zip(tensor.shape, tensor.stride, strict=True) if step != 0]
        shape, stride = tuple(size for size, _ in kept), tuple(step for _, step in kept)
        distinct = 1
        for size in shape:
            distinct *= size
        repeat = tensor.numel // distinct if distinct else 0
        size = tensor.itemsize
        first, end = element_span(shape, stride, tensor.offset)
        key = self._key(tensor)
        flat = np.frombuffer(self.reader.read(key, first * size, (end - first) * size), dtype=_item_dtype(size))
        chunk = max(self.chunk_bytes // size, 1)
        if has_internal_overlap(shape, stride):
            return sum(counter.count(flat[index : index + chunk]) for index in range(0, flat.size, chunk))
        view = np.lib.stride_tricks.as_strided(
            flat, shape=shape or (1,), strides=tuple(step * size for step in stride) or (size,), writeable=False
        )
        return repeat * sum(counter.count(block) for block in _blocks(view, chunk))

    def non_finite_counts(self, tensors: list[TensorFact]) -> Iterator[tuple[TensorFact, int]]:
        """`non_finite` of each tensor, in order, spread over a few threads.

        Copying out of the page cache (pread) and numpy's reductions both run with
        the GIL released, so two threads scan faster than one, which is bound by
        the kernel's copy (benchmarks/README.md has the figures). Tensors go
        to the threads in batches of ~16 MiB: one task per small tensor would spend
        more on handing work between threads than on reading it.
        """
        batches: list[list[TensorFact]] = [[]]
        batch_bytes = 0
        for tensor in tensors:
            if batch_bytes >= SCAN_BATCH_BYTES:
                batches.append([])
                batch_bytes = 0
            batches[-1].append(tensor)
            batch_bytes += tensor.nbytes
        workers = min(MAX_SCAN_THREADS, os.cpu_count() or 1, len(batches))
        if workers <= 1:
            for tensor in tensors:
                yield tensor, self.non_finite(tensor)
            return
        from concurrent.futures import ThreadPoolExecutor  # with logging: only scans need them

        with ThreadPoolExecutor(workers, thread_name_prefix="memlayout-scan") as pool:
            counted = pool.map(lambda batch: [self.non_finite(t) for t in batch], batches)
            for batch, counts in zip(batches, counted, strict=True):
                yield from zip(batch, counts, strict=True)

    def _buffered_chunks(self, tensor: TensorFact) -> Iterator[np.ndarray]:
        # pread into one buffer per thread: nothing of the file is mapped, so RSS
        # stays at the buffer whatever the file size, and the chunk is read into
        # cache-resident memory the reductions then reuse. Only for consumers that
        # finish with a chunk before asking for the next, as non_finite does.
        import numpy as np

        assert self._read_into is not None
        size = tensor.itemsize
        step = max(self.chunk_bytes // size, 1) * size
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < step:
            buffer = self._local.buffer = bytearray(step)
        view = memoryview(buffer)
        key = self._key(tensor)
        start = tensor.offset * size
        remaining = tensor.nbytes
        item = _item_dtype(size)
        while remaining > 0:
            length = min(step, remaining)
            self._read_into(key, start, view[:length])
            yield np.frombuffer(buffer, dtype=item, count=length // size)
            start += length
            remaining -= length

    def fingerprint(self, tensor: TensorFact) -> tuple[int, int]:
        """(XOR, wrapping sum) of the elements' bit patterns in their own width, in one streaming pass.

        Bitwise-equal tensors always get equal fingerprints, whatever their strides
        or chunking, because both operations are associative and commutative.
        Unequal tensors may collide (a permutation does), so an equal fingerprint
        only nominates tensors for `equal`.
        """
        import numpy as np

        xor = total = 0
        for chunk in self.chunks(tensor):
            words = _words(chunk)
            xor ^= int(np.bitwise_xor.reduce(words))
            total += int(words.sum(dtype=words.dtype))
        return xor, total & ((1 << (8 * min(tensor.itemsize, 8))) - 1)

    def equal(self, a: TensorFact, b: TensorFact) -> bool:
        """Whether two tensors of one dtype and shape are bitwise equal, compared chunk by chunk."""
        import numpy as np

        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return all(np.array_equal(left, right) for left, right in paired_chunks(self.chunks(a), self.chunks(b)))

    def constant(self, tensor: TensorFact) -> bool:
        """Whether every element has the first element's bit pattern."""
        first: Any = None
        for chunk in self.chunks(tensor):
            if first is None:
                first = chunk[0]
            if not (chunk == first).all():
                return False
        return True


def _item_dtype(itemsize: int) -> np.dtype[Any]:
    import numpy as np

    return np.dtype(_UINT_FOR_ITEMSIZE.get(itemsize, f"V{itemsize}"))


def _blocks(view: np.ndarray, chunk_elements: int) -> Iterator[np.ndarray]:
    """Flat copies of consecutive leading-index blocks of `view`, about `chunk_elements` each."""
    if view.ndim <= 1:
        for index in range(0, view.size, chunk_elements):
            yield view[index : index + chunk_elements].copy()
        return
    inner = view[0].size
    if inner == 0:
        return
    if inner > chunk_elements:
        for index in range(view.shape[0]):
            yield from _blocks(view[index], chunk_elements)
        return
    rows = max(1, chunk_elements // inner)
    for index in range(0, view.shape[0], rows):
        yield view[index : index + rows].ravel()


def paired_chunks(left: Iterator[np.ndarray], right: Iterator[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Two chunk streams of equal total length, re-cut into pairs of equal-length pieces."""
    a = next(left, None)
    b = next(right, None)
    while a is not None and b is not None:
        length = min(a.size, b.size)
        yield a[:length], b[:length]
        a = a[length:] if a.size > length else next(left, None)
        b = b[length:] if b.size > length else next(right, None)


class _NonFiniteCounter:
    """Counts NaN/Inf in bit-pattern chunks, with a fast no-hit test for the common case.

    In IEEE-style formats (float16/32/64, bfloat16, float8 e5m2 and e4m3fn) the
    special values are exactly those whose exponent field, the bits just below the
    sign, is all ones. With the sign clear such a value is at least the mask as a
    signed integer; with the sign set it is at least sign|mask as an unsigned one.
    So two max reductions, which write nothing, prove a chunk finite, and only a
    chunk with a hit pays for the exact count (faster than masking into a buffer
    first, as measured in benchmarks/README.md). Formats whose special pattern is not that
    (the "fnuz" float8s, e8m0) take the exact count on every chunk.
    """

    def __init__(self, mask: int | None, pattern: int | None) -> None:
        self.mask = mask
        self.pattern = pattern

    def _top_field(self, itemsize: int) -> bool:
        # Whether the mask is the run of bits right below the sign bit.
        assert self.mask is not None
        below_sign = (1 << (8 * itemsize - 1)) - 1
        rest = below_sign ^ self.mask
        return self.mask == self.pattern and self.mask & ~below_sign == 0 and rest & (rest + 1) == 0

    def count(self, bits: np.ndarray) -> int:
        if self.mask is None or self.pattern is None or bits.size == 0:
            return 0
        import numpy as np

        itemsize = bits.dtype.itemsize
        if self._top_field(itemsize):
            sign = 1 << (8 * itemsize - 1)
            if bits.view(f"<i{itemsize}").max() < self.mask and bits.max() < (sign | self.mask):
                return 0
        mask = bits.dtype.type(self.mask)
        return int(np.count_nonzero((bits & mask) == bits.dtype.type(self.pattern)))


def non_finite_count(bits: np.ndarray, dtype: str) -> int:
    """How many elements of a bit-pattern array are NaN or Inf for `dtype`."""
    info = dtype_info(dtype)
    if info.special_mask is None or bits.size == 0:
        return 0
    return _NonFiniteCounter(info.special_mask, info.special_pattern).count(bits)
