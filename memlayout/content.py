"""Reading tensor contents through a loader's `StorageReader`, in logical order.

Rules that look at values (ML102 duplicates, ML503 non-finite) go through here, so
they read only what they need: a few sampled elements, the full contents of true
duplicate candidates, or, with --deep, every tensor in bounded chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from memlayout.dtypes import dtype_info
from memlayout.facts import TensorFact
from memlayout.load.records import StorageReader
from memlayout.strides import element_span

if TYPE_CHECKING:
    import numpy as np

DEFAULT_CHUNK_BYTES = 16 << 20

_UINT_FOR_ITEMSIZE = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def _element_offset(tensor: TensorFact, flat_index: int) -> int:
    offset = tensor.offset
    for size, step in zip(reversed(tensor.shape), reversed(tensor.stride), strict=True):
        flat_index, index = divmod(flat_index, size)
        offset += index * step
    return offset


class ContentReader:
    """Reads the values of tensors described by facts."""

    def __init__(self, reader: StorageReader, storage_keys: dict[str, str]) -> None:
        self.reader = reader
        self.storage_keys = storage_keys

    def _key(self, tensor: TensorFact) -> str:
        return self.storage_keys[tensor.storage]

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

        Bit patterns, not values: equal arrays mean bitwise-equal tensors.
        """
        import numpy as np

        first, end = element_span(tensor.shape, tensor.stride, tensor.offset)
        size = tensor.itemsize
        raw = self.reader.read(self._key(tensor), first * size, (end - first) * size)
        item = np.dtype(_UINT_FOR_ITEMSIZE.get(size, f"V{size}"))
        flat = np.frombuffer(raw, dtype=item)
        if tensor.contiguous:
            return flat.reshape(tensor.shape)
        return np.lib.stride_tricks.as_strided(
            flat, shape=tensor.shape, strides=tuple(s * size for s in tensor.stride), writeable=False
        )

    def chunks(self, tensor: TensorFact, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[np.ndarray]:
        """The tensor's elements (as unsigned bit patterns) in pieces of about `chunk_bytes`.

        Contiguous tensors stream straight from the reader; strided ones are split
        along their outer dims so that no piece spans more than `chunk_bytes`.
        """
        import numpy as np

        size = tensor.itemsize
        item = np.dtype(_UINT_FOR_ITEMSIZE.get(size, f"V{size}"))
        key = self._key(tensor)
        if tensor.contiguous:
            start = tensor.offset * size
            remaining = tensor.nbytes
            step = max(chunk_bytes // size, 1) * size
            while remaining > 0:
                length = min(step, remaining)
                yield np.frombuffer(self.reader.read(key, start, length), dtype=item)
                start += length
                remaining -= length
            return
        yield from self._strided_chunks(tensor.shape, tensor.stride, tensor.offset, size, key, item, chunk_bytes)

    def _strided_chunks(
        self,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        offset: int,
        size: int,
        key: str,
        item: np.dtype,
        chunk_bytes: int,
    ) -> Iterator[np.ndarray]:
        import numpy as np

        first, end = element_span(shape, stride, offset)
        if (end - first) * size <= chunk_bytes or len(shape) <= 1:
            raw = self.reader.read(key, first * size, (end - first) * size)
            flat = np.frombuffer(raw, dtype=item)
            yield np.lib.stride_tricks.as_strided(
                flat, shape=shape, strides=tuple(s * size for s in stride), writeable=False
            ).ravel()
            return
        for index in range(shape[0]):
            yield from self._strided_chunks(
                shape[1:], stride[1:], offset + index * stride[0], size, key, item, chunk_bytes
            )


def non_finite_count(bits: np.ndarray, dtype: str) -> int:
    """How many elements of a bit-pattern array are NaN or Inf for `dtype`."""
    info = dtype_info(dtype)
    if info.special_mask is None or bits.size == 0:
        return 0
    import numpy as np

    mask = bits.dtype.type(info.special_mask)
    pattern = bits.dtype.type(info.special_pattern)
    return int(np.count_nonzero((bits & mask) == pattern))
