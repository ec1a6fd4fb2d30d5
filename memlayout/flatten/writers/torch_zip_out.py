"""Write a torch.save archive whose storage bytes move from IN's file to OUT's in the kernel.

Each record of OUT is a list of pieces: zero padding, a byte range of IN, or bytes
already in memory (data.pkl, a strided tensor made dense). Records are written in
order, as torch's writer writes them (`memlayout.io.zip_archive` lays them out), so
OUT can also be a pipe. A range of IN is moved with `os.copy_file_range` (the
kernel copies page-cache pages, or shares extents on filesystems that can), falling
back to `os.sendfile` (pipes, other filesystems) and then to pread/pwrite.

No byte of a range passes through Python, so each record's CRC-32 is combined
(`zip_archive.crc32_combine`) from its pieces' CRCs: a range covering a whole record
of IN has the CRC IN's directory records for it, any other range is read once to
compute its own. Verification (`torch_zip_verify.ArchiveVerifier`) then reads
OUT back and proves each record's bytes against that CRC.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memlayout.errors import CorruptCheckpointError
from memlayout.flatten.options import Progress
from memlayout.io.zip_archive import (
    RecordLayout,
    crc32,
    crc32_combine,
    end_of_archive,
    layout_records,
)

CHUNK_BYTES = 8 << 20
"""Reads for computing CRCs and fallback copies go in chunks this big."""
# Linux moves at most 0x7ffff000 bytes per copy_file_range or sendfile call.
_MAX_MOVE = 1 << 30
_ZEROS = bytes(64 << 10)



@dataclass(frozen=True)
class Zeros:
    """`length` zero bytes (alignment padding)."""

    length: int


@dataclass(frozen=True)
class FileRange:
    """Bytes `start .. start + length` of IN's file."""

    start: int
    length: int
    crc: int | None = None
    """Their CRC-32 when already known (IN's directory records it for a whole record)."""
    record: str | None = None
    """IN's record the range comes from, for messages."""


@dataclass(frozen=True)
class Data:
    """Bytes built in memory."""

    payload: bytes


Piece = Zeros | FileRange | Data


@dataclass(frozen=True)
class OutRecord:
    """One record of OUT: its name below the archive folder, and its pieces in order."""

    name: str
    pieces: tuple[Piece, ...]

    @property
    def size(self) -> int:
        return sum(_length(piece) for piece in self.pieces)


def _length(piece: Piece) -> int:
    return len(piece.payload) if isinstance(piece, Data) else piece.length


@dataclass
class WrittenArchive:
    """Where every record of OUT went, and the CRC-32 written for it."""

    layouts: list[RecordLayout]
    crcs: list[int]
    records: list[OutRecord]
    bytes_moved: int = 0
    """Bytes of IN moved into OUT."""
    stages: dict[str, float] = field(default_factory=dict)


class _Mover:
    """Moves ranges of IN into OUT at OUT's current position, with the fastest call that works."""

    def __init__(self, source: int, target: int) -> None:
        self.source = source
        self.target = target
        self.kernel_copy = hasattr(os, "copy_file_range")
        self.sendfile = hasattr(os, "sendfile")

    def move(self, start: int, length: int) -> None:
        done = 0
        while done < length:
            count = min(length - done, _MAX_MOVE)
            moved = self._move_once(start + done, count)
            if moved <= 0:
                raise CorruptCheckpointError(f"IN ended {length - done} bytes early while reading at {start + done}")
            done += moved

    def _move_once(self, start: int, count: int) -> int:
        if self.kernel_copy:
            try:
                return os.copy_file_range(self.source, self.target, count, start)
            except OSError as exc:
                # EXDEV (before Linux 5.3, or across filesystems), EINVAL (a pipe, or a
                # filesystem without support), ENOSYS, EOPNOTSUPP: the next way works.
                if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF):
                    raise
                self.kernel_copy = False
        if self.sendfile:
            try:
                return os.sendfile(self.target, self.source, start, count)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self.sendfile = False
        data = os.pread(self.source, min(count, CHUNK_BYTES), start)
        if data:
            _write_all(self.target, data)
        return len(data)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def range_crc(fd: int, start: int, length: int) -> int:
    """CRC-32 of bytes `start .. start + length` of a file, read in chunks (zlib releases the GIL)."""
    crc = 0
    buffer = bytearray(min(CHUNK_BYTES, max(length, 1)))
    view = memoryview(buffer)
    done = 0
    while done < length:
        count = os.preadv(fd, [view[: min(len(view), length - done)]], start + done)
        if count <= 0:
            raise CorruptCheckpointError(f"the file ended {length - done} bytes early while reading at {start + done}")
        crc = crc32(view[:count], crc)
        done += count
    return crc


def expected_crc(source: int, record: OutRecord) -> int:
    """The CRC-32 of a record's bytes, from its pieces, reading only ranges whose CRC is unknown."""
    crc = 0
    for piece in record.pieces:
        if isinstance(piece, Zeros):
            remaining = piece.length
            while remaining:
                step = min(remaining, len(_ZEROS))
                crc = crc32(_ZEROS[:step], crc)
                remaining -= step
        elif isinstance(piece, Data):
            crc = crc32(piece.payload, crc)
        elif piece.length:
            known = piece.crc if piece.crc is not None else range_crc(source, piece.start, piece.length)
            crc = crc32_combine(crc, known, piece.length)
    return crc


WrittenRange = Callable[[int, int, int], None]
"""on_written(record index, offset in OUT, length): these bytes of a record's data are in OUT now."""


class _Writeback:
    """Starts the disk writes of what is written, while the rest is still being written.

    `sync_file_range(SYNC_FILE_RANGE_WRITE)` queues the dirty pages of a range for
    writeback and returns at once, so the final fsync waits only for the last
    stretch instead of the whole file. Linux only; elsewhere (and on pipes) it does
    nothing, which only changes when the disk writes happen.
    """

    STEP = 32 << 20
    _function: Any = None

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.started = 0
        self.enabled = sys.platform.startswith("linux")

    def advance(self, written_to: int) -> None:
        if not self.enabled or written_to - self.started < self.STEP:
            return
        if _Writeback._function is None:
            import ctypes

            function = ctypes.CDLL(None, use_errno=True).sync_file_range
            function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            function.restype = ctypes.c_int
            _Writeback._function = function
        if _Writeback._function(self.fd, self.started, written_to - self.started, _SYNC_FILE_RANGE_WRITE) != 0:
            self.enabled = False  # a pipe, or a filesystem that refuses: the fsync does it all
        self.started = written_to


_SYNC_FILE_RANGE_WRITE = 2


def write_archive(
    source: int,
    target: int,
    archive_name: str,
    records: list[OutRecord],
    progress: Progress | None = None,
    on_written: WrittenRange | None = None,
) -> WrittenArchive:
    """Write the records, then the central directory, at OUT's current position (0 for a fresh file).

    Args:
        source: IN, open for reading.
        target: OUT, open for writing at its start (a file or a pipe).
        archive_name: OUT's top folder (`zip_archive.torch_archive_name`).
        records: Every record, in writing order.
        progress: Told the bytes moved so far.
        on_written: Told each stretch of record data as soon as it is in OUT (a
            verifier reads it back while the rest is written).

    Returns:
        The layouts and CRCs written, for verification.
    """
    layouts = layout_records((f"{archive_name}/{record.name}", record.size) for record in records)
    crcs: list[int] = []
    mover = _Mover(source, target)
    writeback = _Writeback(target)
    total = sum(piece.length for record in records for piece in record.pieces if isinstance(piece, FileRange))
    moved = 0
    for index, (record, layout) in enumerate(zip(records, layouts, strict=True)):
        crc = expected_crc(source, record)
        _write_all(target, layout.local_header())
        at = layout.data_offset
        for piece in record.pieces:
            length = _length(piece)
            if isinstance(piece, Zeros):
                remaining = piece.length
                while remaining:
                    step = min(remaining, len(_ZEROS))
                    _write_all(target, _ZEROS[:step])
                    remaining -= step
            elif isinstance(piece, Data):
                _write_all(target, piece.payload)
            elif piece.length:
                mover.move(piece.start, piece.length)
                moved += piece.length
                if progress is not None:
                    progress("copy", moved, total)
            if on_written is not None and length:
                on_written(index, at, length)
            at += length
            writeback.advance(at)
        _write_all(target, layout.descriptor(crc))
        crcs.append(crc)
    _write_all(target, end_of_archive(layouts, crcs))
    return WrittenArchive(layouts, crcs, records, moved)
