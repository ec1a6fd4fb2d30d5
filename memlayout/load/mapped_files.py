"""Storage bytes read in place from the files that hold them.

Every file format whose tensors sit in the file as raw bytes (torch.save zips,
legacy torch.save files, safetensors files and their shards) reads them through
this one reader: bounds-checked spans over memory maps, with the two extras a
streaming content scan needs to keep memory bounded.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import NamedTuple

from memlayout.errors import CorruptCheckpointError

# Reads up to this size go through pread instead of the map. Touching one byte of
# a mapping maps the whole page-cache folio behind it (megabytes on kernels with
# large folios), so ML102's few sampled elements per tensor would otherwise pull
# most of a big checkpoint into the process's RSS and make closing the map cost
# time in proportion to the file size.
_PREAD_LIMIT = 64 << 10


class Span(NamedTuple):
    """Where one storage's bytes are: which file, from which byte, how many."""

    file: int
    """Index into `MappedFiles.maps` / `fds`."""
    start: int
    """Absolute offset of the storage's byte 0 in the file."""
    size: int


@dataclass
class MappedFiles:
    """Reads storage bytes straight out of memory-mapped files, by storage key.

    Small reads copy through `os.pread`; large ones are zero-copy views of the map,
    which `release` gives back to the kernel once a content scan is done with them.

    Where each storage lies is kept as the loader's own dicts (start, size, and the
    file for several files), not as an object per storage: a checkpoint can hold
    100,000 storages, and the loader has the dicts already.
    """

    starts: dict[str, int]
    """Absolute offset of each storage's byte 0 in its file, by storage key."""
    sizes: dict[str, int]
    """Bytes each storage spans."""
    file_of: dict[str, int] | None = None
    """Index into `maps` / `fds` of each storage's file; None when there is one file."""
    maps: list[mmap.mmap] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    """A descriptor per file for preads; closed by `close`."""
    checksums: dict[str, int] = field(default_factory=dict)
    """CRC-32 of each storage's whole span, where the file records one (zip entries do)."""

    @classmethod
    def open(
        cls,
        paths: list[str],
        starts: dict[str, int],
        sizes: dict[str, int],
        file_of: dict[str, int] | None = None,
        checksums: dict[str, int] | None = None,
    ) -> MappedFiles:
        """Map each file read-only and keep a descriptor for preads.

        Args:
            paths: The files, in the order `file_of` indexes them.
            starts: Where each storage's bytes start in its file, by storage key.
            sizes: How many bytes each storage spans.
            file_of: Which file holds each storage; None when `paths` is one file.
            checksums: The CRC-32 each whole span has, where the files record one.

        Returns:
            The reader; `close` releases the maps and descriptors.
        """
        reader = cls(starts, sizes, file_of, checksums={} if checksums is None else checksums)
        try:
            for path in paths:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                reader.fds.append(fd)
                # mmap refuses size 0; an empty file simply has no spans to read.
                size = os.fstat(fd).st_size
                reader.maps.append(mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else mmap.mmap(-1, 1))
        except BaseException:
            reader.close()
            raise
        return reader

    @property
    def spans(self) -> dict[str, Span]:
        """Every storage's span, built on demand (for tests and tools; reads do not use it)."""
        file_of = self.file_of or {}
        return {key: Span(file_of.get(key, 0), start, self.sizes[key]) for key, start in self.starts.items()}

    @property
    def data_start(self) -> dict[str, int]:
        """storage key -> absolute offset in its file (for single-file writers such as flatten)."""
        return self.starts

    @property
    def data_size(self) -> dict[str, int]:
        return self.sizes

    def _bounds(self, storage_key: str, start: int, length: int) -> tuple[int, int]:
        """(file index, absolute offset) of bytes `start .. start + length` of the storage."""
        size = self.sizes[storage_key]
        if start < 0 or length < 0 or start + length > size:
            raise CorruptCheckpointError(
                f"storage {storage_key} is {size} bytes, but a tensor reads bytes {start}..{start + length}"
            )
        file = self.file_of[storage_key] if self.file_of is not None else 0
        return file, self.starts[storage_key] + start

    def checksum(self, storage_key: str, start: int, length: int) -> int | None:
        """The CRC-32 the file records for these bytes, from metadata alone; None if it records none.

        A recorded CRC covers a storage's whole span, so only a read of exactly that
        span has one.
        """
        if start != 0 or length != self.sizes[storage_key]:
            return None
        return self.checksums.get(storage_key)

    def read(self, storage_key: str, start: int, length: int) -> bytes | memoryview:
        """Return `length` bytes of storage `storage_key` from byte `start`."""
        file, base = self._bounds(storage_key, start, length)
        if length <= _PREAD_LIMIT:
            return os.pread(self.fds[file], length, base)
        return memoryview(self.maps[file])[base : base + length]

    def read_into(self, storage_key: str, start: int, buffer: memoryview) -> None:
        """Copy `len(buffer)` bytes of the storage from `start` into `buffer` (pread: nothing is mapped)."""
        file, base = self._bounds(storage_key, start, len(buffer))
        if os.preadv(self.fds[file], [buffer], base) != len(buffer):
            # A short read means the file shrank under us; the map would fault too.
            raise CorruptCheckpointError(f"storage {storage_key} could not be read in full")

    def release(self, storage_key: str, start: int, length: int) -> None:
        """Drop the map's pages over these bytes from the process (not from the page cache).

        A streaming scan calls this on every chunk it has finished, so that RSS stays
        at one chunk instead of growing to the whole file: mapped file pages count in
        RSS once touched. The data stays readable; touching it again maps it again.
        """
        file, base = self._bounds(storage_key, start, length)
        mapped = self.maps[file]
        # madvise wants a page-aligned start; widening to whole pages is harmless
        # because a read-only file map refaults any page it needs again.
        first = base - base % mmap.PAGESIZE
        end = min(base + length, len(mapped))
        if end > first:
            mapped.madvise(mmap.MADV_DONTNEED, first, end - first)

    def close(self) -> None:
        """Unmap every file and close every descriptor."""
        for mapped in self.maps:
            mapped.close()
        for fd in self.fds:
            os.close(fd)
        self.maps, self.fds = [], []
