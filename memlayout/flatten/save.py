"""Write flattened objects atomically, and prove the written file holds what was meant.

OUT is written to a temporary beside it (`memlayout.io.atomic_write`), checked, and
only then fsynced and renamed over OUT; a failure leaves OUT and IN exactly as they
were. The checks: OUT read as metadata against the plan (every name's layout,
which names share a storage, every buffer's size), and its bytes, either against
the filled buffers (`verify_torch_file`) or, for an archive streamed from IN,
read back and proved against the CRC-32 of IN's bytes (`verify_archive`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memlayout.core.fact_builder import build_facts
from memlayout.errors import CorruptCheckpointError, FlattenError
from memlayout.flatten.archive_out import FileRange, OutRecord, WrittenArchive, range_crc
from memlayout.flatten.options import Progress
from memlayout.flatten.plan import FlatPlan, Placement
from memlayout.io.atomic_write import atomic_file, fsync_path
from memlayout.io.zip_archive import crc32_combine, end_of_archive
from memlayout.load.records import LoadedSource

if TYPE_CHECKING:
    import torch

COMPARE_CHUNK_BYTES = 8 << 20


def save_torch(obj: Any, path: str, locations: dict[int, str] | None = None) -> None:
    """torch.save `obj` to `path` and fsync it.

    Args:
        obj: What to save.
        path: Where.
        locations: The location each storage records, by storage identity (`_torch.storage_id`), where it is not
            its own (`memlayout.flatten.torch_tree.location_tagging_pickle`).
    """
    import torch

    if locations:
        from memlayout.flatten.torch_tree import location_tagging_pickle

        torch.save(obj, path, pickle_module=location_tagging_pickle(locations))
    else:
        torch.save(obj, path)
    fsync_path(path)


def _expected_by_name(plan: FlatPlan) -> dict[str, tuple[int, Placement]]:
    return {name: (index, p) for index, p in plan.placements.values() for name in p.names}


def compare_bytes(path: str, file_offset: int, buffer: torch.Tensor) -> bool:
    """Whether `buffer`'s bytes equal the file's from `file_offset`, read in chunks.

    Reads go through the page cache with pread, not a map, so comparing a file as
    big as memory never doubles the process's resident memory.
    """
    import torch

    from memlayout.flatten.apply import host_bytes, pread_into

    chunk = torch.empty(min(COMPARE_CHUNK_BYTES, max(buffer.numel(), 1)), dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, buffer.numel(), chunk.numel()):
            length = min(chunk.numel(), buffer.numel() - start)
            pread_into(fd, host_bytes(chunk)[:length], file_offset + start)
            expected = buffer[start : start + length]
            if expected.device.type != "cpu":
                expected = expected.cpu()
            if not torch.equal(chunk[:length], expected):
                return False
    finally:
        os.close(fd)
    return True


def check_layout(
    path: str,
    plan: FlatPlan,
    expected_names: set[str] | None = None,
    load: Callable[[str], LoadedSource] | None = None,
) -> tuple[dict[int, int], dict[int, str]]:
    """Check a written torch.save file's layout against the plan, reading it as metadata.

    Args:
        path: The file just written.
        plan: The layout it should have.
        expected_names: Names it must hold (all of IN's, for a same-format rewrite).
        load: Reads the written file as records; the torch.save zip reader by
            default (a TorchScript or torch.export archive needs its own).

    Returns:
        (plan buffer index -> absolute file offset of its record's data,
        plan buffer index -> its record key).

    Raises:
        FlattenError: any name's layout or the sharing differs from the plan, a
            name is missing, or a buffer has the wrong size or records another device.
    """
    from memlayout.load.torch_zip import load_torch_zip

    with (load or load_torch_zip)(path) as source:
        facts = build_facts(source)
        expected = _expected_by_name(plan)
        buffer_of: dict[str, int] = {}
        for tensor in facts.tensors:
            for name in tensor.names:
                if name not in expected:
                    if tensor.numel == 0:
                        continue
                    raise FlattenError(f"verification failed: {path} holds {name}, which was never planned")
                index, placement = expected[name]
                got = (tensor.offset, tensor.shape, tensor.stride, tensor.dtype)
                want = (placement.offset, placement.shape, placement.stride, placement.dtype)
                if got != want:
                    raise FlattenError(f"verification failed: {name} was written as {got}, planned {want}")
                if buffer_of.setdefault(tensor.storage, index) != index:
                    raise FlattenError(f"verification failed: {name} shares a storage it should not")
        if len(set(buffer_of.values())) != len(buffer_of):
            raise FlattenError("verification failed: a flat buffer was written as several storages")
        if expected_names is not None and not expected_names <= set(facts._by_name):
            missing = sorted(expected_names - set(facts._by_name))
            raise FlattenError(f"verification failed: {len(missing)} tensors missing, e.g. {missing[0]}")
        reader: Any = source.reader
        offsets: dict[int, int] = {}
        keys: dict[int, str] = {}
        for storage_id, index in buffer_of.items():
            storage = facts.storage(storage_id)
            if storage.nbytes != plan.buffers[index].nbytes:
                raise FlattenError(f"verification failed: buffer {plan.buffers[index].label} has the wrong size")
            if storage.device != plan.buffers[index].device:
                raise FlattenError(
                    f"verification failed: buffer {plan.buffers[index].label} records device {storage.device}, "
                    f"not {plan.buffers[index].device}"
                )
            offsets[index] = reader.data_start[storage.key]
            keys[index] = storage.key
    return offsets, keys


def verify_torch_file(
    path: str,
    plan: FlatPlan,
    buffers: list[torch.Tensor],
    expected_names: set[str] | None = None,
    load: Callable[[str], LoadedSource] | None = None,
) -> None:
    """Check a written torch.save file against the plan and the filled buffers.

    Args:
        path: The file just written.
        plan: The layout it should have.
        buffers: The flat buffers whose bytes it should hold.
        expected_names: Names it must hold (all of IN's, for a same-format rewrite).
        load: Reads the written file as records (see `check_layout`).

    Raises:
        FlattenError: any name's layout, the sharing, or any byte differs.
    """
    offsets, _ = check_layout(path, plan, expected_names, load)
    for index, offset in offsets.items():
        if not compare_bytes(path, offset, buffers[index]):
            raise FlattenError(f"verification failed: bytes of {plan.buffers[index].label} differ on disk")


def write_torch(
    obj: Any,
    out: str,
    verify: Callable[[str], None] | None,
    locations: dict[int, str] | None = None,
) -> bool:
    """torch.save `obj` atomically to `out`, verifying the temporary first.

    Args:
        obj: The flattened tree.
        out: The destination; replaced only after verification passes.
        verify: Called with the temporary path; raises to abort. None skips it.
        locations: The location each storage records where it is not its own (see `save_torch`).

    Returns:
        Whether OUT was verified: not with `verify` None, nor when OUT is a device
        or pipe, which is written straight into and cannot be re-read.
    """
    with atomic_file(out) as output:
        save_torch(obj, output.path, locations)
        if verify is None or output.is_stream:
            return False
        verify(output.path)
        return True


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
        from concurrent.futures import ThreadPoolExecutor

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
        if isinstance(piece, FileRange) and piece.crc is not None and range_crc(source, piece.start, piece.length) != piece.crc:
            raise CorruptCheckpointError(
                f"{what}: storage record {piece.record} fails its zip checksum; IN is damaged",
                "restore IN from a good copy; flatten copies bytes as they are",
            )
    raise FlattenError(f"verification failed: {name} does not hold the bytes meant for it")
