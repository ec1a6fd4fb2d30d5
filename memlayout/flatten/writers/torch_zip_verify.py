"""Proof that a torch.save archive streamed from IN holds IN's bytes, read back while it is written.

The torch zip writer (`torch_zip`) moves storage bytes from IN's file to OUT's in
the kernel (`torch_zip_out`), so no byte passes through Python to be compared.
OUT is read back instead, stretch by stretch as it is written, and each record's
CRC-32 is proved against the one its pieces promise, which came from IN's own bytes.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memlayout.errors import CorruptCheckpointError, FlattenError
from memlayout.flatten.options import Progress
from memlayout.flatten.save import COMPARE_CHUNK_BYTES
from memlayout.flatten.writers.torch_zip_out import FileRange, OutRecord, WrittenArchive, range_crc
from memlayout.io.zip_archive import crc32_combine, end_of_archive


class ArchiveVerifier:
    """Reads OUT back while it is written and proves every byte: headers exactly, data by CRC-32.

    Each stretch of record data is read back as soon as `write_archive` reports it
    written, on worker threads (pread and zlib release the GIL, so this runs beside
    the kernel's copy), and its CRC-32 is computed. `finish` combines them into each
    record's CRC and compares it with the CRC written for the record, which came
    from IN's own bytes (IN's recorded CRC, or one computed from IN): a record
    holding anything but the bytes meant fails. Headers, data descriptors and the
    directory are compared byte for byte. Reads go through the page cache, never a
    map, so OUT is never held in memory.

    Args:
        out: OUT, open for reading.
        source: IN, open for reading (to tell a damaged IN from a bad write).
        what: IN's path, for messages.
        progress: Told the bytes verified so far.
    """

    def __init__(self, out: int, source: int, what: str, progress: Progress | None = None) -> None:
        self.out = out
        self.source = source
        self.what = what
        self.progress = progress
        self.pool = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)))
        self.pending: list[tuple[int, int, Any]] = []
        self.gathered: tuple[int, int, int] | None = None
        self.submitted = 0
        self.verified = 0
        self.lock = threading.Lock()

    def written(self, record: int, start: int, length: int) -> None:
        """`write_archive`'s `on_written`: queue these bytes of OUT to be read back.

        Stretches of one record follow each other in OUT, so they are gathered into
        chunks of about COMPARE_CHUNK_BYTES: one task per slot would cost a thread
        hand-off per tensor.
        """
        if self.gathered is not None:
            gathered_record, gathered_start, gathered_length = self.gathered
            if gathered_record == record and gathered_start + gathered_length == start:
                start, length = gathered_start, gathered_length + length
            else:
                self._submit(*self.gathered)
        self.gathered = None
        while length >= COMPARE_CHUNK_BYTES:
            self._submit(record, start, COMPARE_CHUNK_BYTES)
            start, length = start + COMPARE_CHUNK_BYTES, length - COMPARE_CHUNK_BYTES
        if length:
            self.gathered = (record, start, length)

    def _submit(self, record: int, start: int, length: int) -> None:
        self.pending.append((record, length, self.pool.submit(self._crc, start, length)))
        self.submitted += length

    def _crc(self, start: int, length: int) -> int:
        crc = range_crc(self.out, start, length)
        if self.progress is not None:
            with self.lock:
                self.verified += length
                self.progress("verify", self.verified, self.submitted)
        return crc

    def finish(self, written: WrittenArchive) -> None:
        """Wait for the reads, and compare everything with what was meant.

        Raises:
            CorruptCheckpointError: IN's bytes do not match the CRC IN records for them.
            FlattenError: OUT differs from what was meant.
        """
        if self.gathered is not None:
            self._submit(*self.gathered)
            self.gathered = None
        try:
            crcs = [0] * len(written.layouts)
            for record, length, future in self.pending:
                crcs[record] = crc32_combine(crcs[record], future.result(), length)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
        for layout, crc in zip(written.layouts, written.crcs, strict=True):
            header = layout.local_header()
            if os.pread(self.out, len(header), layout.header_offset) != header:
                raise FlattenError(f"verification failed: the local header of {layout.name} differs on disk")
            descriptor = layout.descriptor(crc)
            if os.pread(self.out, len(descriptor), layout.data_offset + layout.size) != descriptor:
                raise FlattenError(f"verification failed: the data descriptor of {layout.name} differs on disk")
        tail = end_of_archive(written.layouts, written.crcs)
        if os.pread(self.out, len(tail) + 1, written.layouts[-1].end) != tail:
            raise FlattenError("verification failed: the zip directory differs on disk")
        for index, (layout, expected, got) in enumerate(zip(written.layouts, written.crcs, crcs, strict=True)):
            if got != expected:
                _blame(self.source, written.records[index], layout.name, self.what)

    def abandon(self) -> None:
        """Stop reading (writing failed)."""
        self.pool.shutdown(wait=True, cancel_futures=True)


def _blame(source: int, record: OutRecord, name: str, what: str) -> None:
    # OUT's record does not have the CRC its pieces promised. Either IN's bytes do
    # not match the CRC IN's own directory records (IN is damaged), or the write went wrong.
    for piece in record.pieces:
        if (isinstance(piece, FileRange) and piece.crc is not None
                and range_crc(source, piece.start, piece.length) != piece.crc):
            raise CorruptCheckpointError(
                f"{what}: storage record {piece.record} fails its zip checksum; IN is damaged",
                "restore IN from a good copy; flatten copies bytes as they are",
            )
    raise FlattenError(f"verification failed: {name} does not hold the bytes meant for it")
