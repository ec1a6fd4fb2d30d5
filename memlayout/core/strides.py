"""Pure geometry of strided tensors: which bytes of a storage a view touches.

Everything here works on (shape, stride, offset, itemsize) tuples, so it serves live
tensors and file metadata alike, and it is what the property tests compare against
a brute-force byte set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Above this many runs, enumerating exact byte intervals costs more than it tells;
# such views fall back to their span (first to last byte), marked approximate.
MAX_EXACT_RUNS = 1 << 22


class MemoryFormat(str, enum.Enum):
    """The dense orders a tensor's strides can follow."""

    CONTIGUOUS = "contiguous"
    CHANNELS_LAST = "channels_last"
    CHANNELS_LAST_3D = "channels_last_3d"
    STRIDED = "strided"
    """Anything else: transposed, sliced, expanded, permuted."""


def numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _dense_in_order(shape: tuple[int, ...], stride: tuple[int, ...], order: tuple[int, ...]) -> bool:
    # `order` lists dims from innermost to outermost. Size-1 dims may carry any
    # stride, exactly as torch's own is_contiguous ignores them.
    expected = 1
    for dim in order:
        size = shape[dim]
        if size == 1:
            continue
        if stride[dim] != expected:
            return False
        expected *= size
    return True


def is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """torch's `is_contiguous()` for the default (row-major) format."""
    # One pass from the innermost dim, the hot path of every fact: size-1 dims may
    # carry any stride, and an empty tensor is contiguous whatever its strides.
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return numel(shape) == 0
        expected *= size
    return True


def memory_format(shape: tuple[int, ...], stride: tuple[int, ...]) -> MemoryFormat:
    """The dense format the strides follow; row-major wins ties (e.g. 1x1 spatial)."""
    if is_contiguous(shape, stride):
        return MemoryFormat.CONTIGUOUS
    if len(shape) == 4 and _dense_in_order(shape, stride, (1, 3, 2, 0)):
        return MemoryFormat.CHANNELS_LAST
    if len(shape) == 5 and _dense_in_order(shape, stride, (1, 4, 3, 2, 0)):
        return MemoryFormat.CHANNELS_LAST_3D
    return MemoryFormat.STRIDED


def expanded_dimensions(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions of more than one element that `expand` made (stride 0): one element in memory, read again."""
    return tuple(dim for dim, (size, step) in enumerate(zip(shape, stride, strict=True)) if size > 1 and step == 0)


def dimension_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """The dimensions of more than one element, from the outermost to the innermost in memory (a dimension of one
    element has no place in a layout: its stride means nothing); among equal strides, the earlier dimension first."""
    return tuple(sorted((dim for dim, size in enumerate(shape) if size != 1), key=lambda dim: (-stride[dim], dim)))


def dense_strides_in_order(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a dense tensor of `shape` whose dimensions lie in memory in `order`, outermost first; a
    dimension absent from `order` (of one element) takes the stride of the next dimension inward."""
    strides = [0] * len(shape)
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step *= max(shape[dim], 1)
    placed = set(order)
    inward = 1
    for dim in reversed(range(len(shape))):
        if dim in placed:
            inward = strides[dim] * max(shape[dim], 1)
        else:
            strides[dim] = inward
    return tuple(strides)


def element_span(shape: tuple[int, ...], stride: tuple[int, ...], offset: int) -> tuple[int, int]:
    """First element and one past the last element the view can touch; (offset, offset) if empty.

    Negative strides cannot occur in torch, so the first element is always at `offset`.
    """
    if numel(shape) == 0:
        return offset, offset
    last = offset + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    return offset, last + 1


def has_internal_overlap(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when two different indices of the view address the same element.

    A zero stride on a dim of size > 1 (from `expand`) always overlaps. Otherwise the
    cheap test torch itself uses proves most layouts overlap-free; the rest are decided
    exactly by enumerating element offsets.
    """
    dims = [(step, size) for size, step in zip(shape, stride, strict=True) if size > 1]
    if numel(shape) == 0 or not dims:
        return False
    if any(step == 0 for step, _ in dims):
        return True
    dims.sort()
    reach = 0
    for step, size in dims:
        if step <= reach:
            break
        reach += (size - 1) * step
    else:
        return False
    count = numel(shape)
    if count > MAX_EXACT_RUNS:
        # Too many elements to enumerate: torch calls this MemOverlap::TooHard and
        # treats it as overlapping, and so do we.
        return True
    import numpy as np

    offsets = np.zeros(1, dtype=np.int64)
    for step, size in dims:
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64) * step).ravel()
    return bool(np.unique(offsets).size < offsets.size)


@dataclass(frozen=True)
class ByteSet:
    """The bytes of a storage a view touches, as sorted disjoint half-open intervals."""

    intervals: tuple[tuple[int, int], ...]
    exact: bool
    """False when the view had too many runs and `intervals` is just its span."""

    @property
    def start(self) -> int:
        return self.intervals[0][0] if self.intervals else 0

    @property
    def end(self) -> int:
        return self.intervals[-1][1] if self.intervals else 0

    @property
    def span(self) -> tuple[int, int]:
        """(start, end) in one look, for loops over every tensor of a checkpoint."""
        intervals = self.intervals
        return (intervals[0][0], intervals[-1][1]) if intervals else (0, 0)

    @property
    def nbytes(self) -> int:
        return sum(end - start for start, end in self.intervals)


EMPTY_BYTE_SET = ByteSet((), True)


def contiguous_byte_set(offset: int, count: int, itemsize: int) -> ByteSet:
    """The bytes of a contiguous view of `count` elements: one run, no geometry needed."""
    if count == 0:
        return EMPTY_BYTE_SET
    return ByteSet(((offset * itemsize, (offset + count) * itemsize),), True)


def byte_set(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, itemsize: int) -> ByteSet:
    """Exact byte intervals touched by a view, merging dims that are dense together.

    Dims are walked from the smallest stride up; while a dim's stride equals the
    run built so far, it extends the run. What is left is enumerated as run starts.
    """
    if numel(shape) == 0:
        return EMPTY_BYTE_SET
    # Zero-stride (expanded) and size-1 dims add no new bytes.
    dims = sorted((step, size) for size, step in zip(shape, stride, strict=True) if size > 1 and step != 0)
    run = 1
    while dims and dims[0][0] <= run:
        step, size = dims[0]
        if step == run:
            run *= size
            dims.pop(0)
        else:
            break
    runs = numel(tuple(size for _, size in dims))
    if runs > MAX_EXACT_RUNS:
        first, last = element_span(shape, stride, offset)
        return ByteSet(((first * itemsize, last * itemsize),), False)
    if not dims:
        return ByteSet(((offset * itemsize, (offset + run) * itemsize),), True)
    import numpy as np

    starts = np.full(1, offset, dtype=np.int64)
    for step, size in dims:
        starts = (starts[:, None] + np.arange(size, dtype=np.int64) * step).ravel()
    starts = np.unique(starts) * itemsize
    ends = starts + run * itemsize
    return ByteSet(_merge(zip(starts.tolist(), ends.tolist(), strict=True)), True)


def _merge(intervals: object) -> tuple[tuple[int, int], ...]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):  # type: ignore[call-overload]
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((start, end) for start, end in merged)


def union(sets: list[ByteSet]) -> tuple[tuple[int, int], ...]:
    """Merged intervals covered by any of `sets`."""
    return _merge(interval for byte_set_ in sets for interval in byte_set_.intervals)


class Relation(str, enum.Enum):
    """How the byte sets of two views in one storage relate."""

    DISJOINT = "disjoint"
    EQUAL = "equal"
    CONTAINS = "contains"
    """The first view's bytes include all of the second's."""
    CONTAINED = "contained"
    PARTIAL = "partial"
    """They share some bytes and each has bytes the other lacks."""


def _intersection_bytes(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> int:
    shared = 0
    i = j = 0
    while i < len(a) and j < len(b):
        low = max(a[i][0], b[j][0])
        high = min(a[i][1], b[j][1])
        if low < high:
            shared += high - low
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def relation(a: ByteSet, b: ByteSet) -> Relation:
    """Classify two byte sets of the same storage."""
    if not a.intervals or not b.intervals or a.end <= b.start or b.end <= a.start:
        return Relation.DISJOINT
    shared = _intersection_bytes(a.intervals, b.intervals)
    if shared == 0:
        return Relation.DISJOINT
    size_a, size_b = a.nbytes, b.nbytes
    if shared == size_a == size_b:
        return Relation.EQUAL
    if shared == size_b:
        return Relation.CONTAINS
    if shared == size_a:
        return Relation.CONTAINED
    return Relation.PARTIAL
