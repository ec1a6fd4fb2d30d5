"""torch.save zip files rewritten flat, as a state dict or (with --trust) a module pickle.

IN's tree is rebuilt from its pickle with stand-in storages (`torch_tree`), and its
tensors are re-pointed at views of flat buffers. Then:

- on the CPU, and wherever each tensor keeps the device IN records (the default),
  the flat buffers are never filled. torch pickles the flat tree, each storage
  recording its buffer's device (a CUDA checkpoint stays one, on a machine without
  a GPU), and OUT is written record by record in torch.save's own layout, each
  storage's used bytes moved from IN's file to their slot in OUT's by the kernel
  (`torch_zip_out`), and proved as they are written (`torch_zip_verify`). OUT is read back and proved against IN's CRCs,
  read as metadata against the plan, and opened by `torch.load(mmap=True)` before it replaces
  anything. Memory stays near a few chunks, whatever the model's size.
- moved to CUDA (`--device cuda`), the buffers are allocated on the device and
  filled from IN's file through pinned staging chunks, and torch.save writes them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.errors import FlattenError
from memlayout.flatten.apply import (
    allocate,
    as_bits,
    copy_from_file,
    host_bytes,
    pread_into,
    rebind,
    torch_dtype,
    views_of,
    walk_tensors,
)
from memlayout.flatten.cudnn_adopt import adopt_cudnn_layouts
from memlayout.flatten.options import FlattenOptions
from memlayout.flatten.plan import FlatBuffer, FlatPlan, Slot
from memlayout.flatten.save import check_layout, verify_torch_file, write_torch
from memlayout.flatten.torch_tree import pickle_records, rebuild_tree
from memlayout.flatten.verification import (
    BUFFERS_WRITTEN,
    COPIED_BY_CRC,
    LAYOUT,
    MAIN_NAMES,
    RESTRIDED_VALUES,
    ZIP_LAYOUT,
)
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.flatten.writers.torch_zip_out import (
    Data,
    FileRange,
    OutRecord,
    Piece,
    Zeros,
    write_archive,
)
from memlayout.flatten.writers.torch_zip_verify import ArchiveVerifier
from memlayout.io.atomic_write import atomic_file
from memlayout.io.zip_archive import (
    RecordSpans,
    ZipReader,
    archive_prefix,
    new_serialization_id,
    torch_archive_name,
)
from memlayout.load.main_module import classes_from_main, pickle_module_resolving_main
from memlayout.load.records import LoadedSource

if TYPE_CHECKING:
    import torch

FILE_FORMAT_VERSION = b"3\n"
"""The `version` record torch's writer closes a torch.save archive with (kProducedFileFormatVersion)."""


class TorchZipWriter(FlattenWriter):
    """Writes OUT in torch.save's own format, moving each storage's used bytes from IN's file."""

    formats = ("torch-zip",)

    def label(self, source: LoadedSource) -> str:
        return "torch.save module pickle" if source.modules else "torch.save state dict"

    def write(self, job: FlattenJob) -> Written:
        stages: dict[str, float] = {}
        started = time.perf_counter()
        source = os.open(job.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            archive = ZipReader(source, os.fstat(source).st_size, 0, job.path)
            prefix = archive_prefix(archive.names)
            _refuse_foreign_byte_order(archive, prefix, job.path)
            # Where each storage's bytes lie is what the loader already found.
            reader: Any = job.source.reader
            spans = RecordSpans(reader.starts, reader.sizes, reader.checksums)
            tree, stand_ins = rebuild_tree(archive, prefix, job.options.trust, job.path, job.options.main_module)
            if job.options.keeps_devices or all(flat.device == "cpu" for flat in job.plan.buffers):
                buffers = _unfilled_buffers(job)
                rebind(tree, job.plan, views_of(job.plan, buffers), stand_ins.key_of)
                stages["rebuild"] = time.perf_counter() - started
                locations = _locations_of_in(job, buffers, stand_ins) if job.options.keeps_devices else None
                return _stream(job, tree, buffers, stand_ins, source, spans, stages, locations)
            return _through_memory(job, tree, stand_ins, spans)
        finally:
            os.close(source)


def _refuse_foreign_byte_order(archive: Any, prefix: str, path: str) -> None:
    name = f"{prefix}byteorder"
    order = archive.read(name).decode("ascii", "replace") if name in archive.by_name else "little"
    if order != sys.byteorder:
        # torch.load would swap every value; flatten moves bytes as they are.
        raise FlattenError(
            f"{path} was saved on a {order}-endian machine and flatten copies bytes as they are",
            f"load and re-save it with torch on this {sys.byteorder}-endian machine first",
        )


def _locations_of_in(job: FlattenJob, buffers: list[torch.Tensor], stand_ins: Any) -> dict[int, str]:
    """The location each storage of the flat tree records: its buffer's device, or, for a
    storage no view moved, the one IN records for it."""
    locations = {
        _torch.storage_id(storage): job.source.storages[key].device
        for key, storage in stand_ins.storages.items() if key in job.source.storages
    }
    locations.update(
        {_torch.storage_id(buffer.untyped_storage()): flat.device
         for flat, buffer in zip(job.plan.buffers, buffers, strict=True)}
    )
    return locations


def _unfilled_buffers(job: FlattenJob) -> list[torch.Tensor]:
    import torch

    # Only their sizes and identities are used (to pickle the views): no page is
    # ever touched, so they cost address space, not memory.
    return [torch.empty(flat.nbytes, dtype=torch.uint8) for flat in job.plan.buffers]


def _stream(
    job: FlattenJob, tree: Any, buffers: list[torch.Tensor], stand_ins: Any, source: int, spans: RecordSpans,
    stages: dict[str, float], locations: dict[int, str] | None = None,
) -> Written:
    started = time.perf_counter()
    pickled = pickle_records(tree, locations, job.objects_from_main())
    buffer_index = {_torch.storage_id(buffer.untyped_storage()): index for index, buffer in enumerate(buffers)}
    records = [OutRecord(name, (Data(payload),)) for name, payload in pickled.small]
    for key, storage in pickled.storages:
        index = buffer_index.get(_torch.storage_id(storage))
        if index is not None:
            pieces = _buffer_pieces(job.plan.buffers[index], source, spans)
        else:
            pieces = _unplaced_pieces(storage, stand_ins.key_of_storage(storage), spans)
        records.append(OutRecord(f"data/{key}", pieces))
    records.append(OutRecord("version", (Data(FILE_FORMAT_VERSION),)))
    records.append(OutRecord(".data/serialization_id", (Data(new_serialization_id().encode("ascii")),)))
    stages["pickle"] = time.perf_counter() - started
    names = {name for tensor in job.facts.tensors for name in tensor.names}
    verified = False
    with atomic_file(job.out) as output:
        started = time.perf_counter()
        verifier = None
        if job.options.verify and not output.is_stream:
            verifier = ArchiveVerifier(output.fd, source, job.path, job.progress)
        try:
            written = write_archive(
                source, output.fd, torch_archive_name(job.out), records, job.progress,
                verifier.written if verifier is not None else None,
            )
        except BaseException:
            if verifier is not None:
                verifier.abandon()
            raise
        stages["copy"] = time.perf_counter() - started
        if verifier is not None:
            started = time.perf_counter()
            # The disk writes the tail while the checks run; the commit's fsync then waits less.
            flushing = threading.Thread(target=_flush, args=(output.fd,), daemon=True)
            flushing.start()
            verifier.finish(written)
            from_main = classes_from_main(job.source.pickle_globals)
            offsets, _ = check_layout(output.path, job.plan, names, from_main=from_main)
            restrided = _restrided_values_equal(output.fd, offsets, job.plan, source, spans)
            _torch_reads(output.path, job.options, tree)
            flushing.join()
            stages["verify"] = time.perf_counter() - started
            verified = True
        closing = time.perf_counter()
    stages["fsync"] = time.perf_counter() - closing
    if not verified:
        return Written(written.bytes_moved, False, (), stages)
    checks = (
        COPIED_BY_CRC, *((RESTRIDED_VALUES,) if restrided else ()), ZIP_LAYOUT, *((MAIN_NAMES,) if from_main else ())
    )
    return Written(written.bytes_moved, True, checks, stages)


def _restrided_values_equal(
    out: int, offsets: dict[int, int], plan: FlatPlan, source: int, spans: RecordSpans
) -> int:
    """Read back every tensor made dense and compare its values with IN's view, bit for bit; how many there were.

    A re-strided tensor's record holds bytes built in memory, so its CRC-32 proves
    only that OUT holds what was built; this proves what was built is IN's values.

    Raises:
        FlattenError: a value differs.
    """
    import torch

    count = 0
    for index, flat in enumerate(plan.buffers):
        for slot in flat.slots:
            if not slot.dense or slot.nbytes == 0:
                continue
            view = slot.views[0]
            _, offset, shape, stride, dtype = view.source
            written = torch.frombuffer(bytearray(os.pread(out, slot.nbytes, offsets[index] + slot.start)),
                                       dtype=torch.uint8)
            read = torch.frombuffer(
                bytearray(os.pread(source, slot.source_nbytes, spans.starts[slot.source_storage] + slot.source_start)),
                dtype=torch.uint8,
            )
            after = torch.empty(0, dtype=torch_dtype(dtype)).set_(written.untyped_storage(), 0, view.shape, view.stride)
            before = torch.empty(0, dtype=torch_dtype(dtype)).set_(
                read.untyped_storage(), offset - slot.source_start // view.itemsize, shape, stride
            )
            if not torch.equal(as_bits(after), as_bits(before)):
                raise FlattenError(f"verification failed: {', '.join(view.names)} read back with other values than "
                                   "IN's")
            count += 1
    return count


def _flush(fd: int) -> None:
    # Errors are left to the commit's own fsync, which reports them.
    with contextlib.suppress(OSError):
        os.fdatasync(fd)


def _buffer_pieces(flat: FlatBuffer, source: int, spans: RecordSpans) -> tuple[Piece, ...]:
    pieces: list[Piece] = []
    cursor = 0
    for slot in flat.slots:
        if slot.nbytes == 0:
            continue
        if slot.start > cursor:
            pieces.append(Zeros(slot.start - cursor))
        key = slot.source_storage
        if slot.dense:
            pieces.append(Data(_dense_bytes(source, spans.starts[key], slot)))
        else:
            whole = slot.source_start == 0 and slot.nbytes == spans.sizes[key]
            crc = spans.checksums.get(key) if whole else None
            pieces.append(FileRange(spans.starts[key] + slot.source_start, slot.nbytes, crc, f"data/{key}"))
        cursor = slot.start + slot.nbytes
    if flat.nbytes > cursor:
        pieces.append(Zeros(flat.nbytes - cursor))
    return tuple(pieces)


def _unplaced_pieces(storage: Any, key: str | None, spans: RecordSpans) -> tuple[Piece, ...]:
    # A storage no planned view reaches (an empty tensor's, or one held by an object
    # flatten does not walk) is written whole, as torch.save would write it.
    nbytes = storage.nbytes()
    if key is not None:
        crc = spans.checksums.get(key) if nbytes == spans.sizes[key] else None
        return (FileRange(spans.starts[key], nbytes, crc, f"data/{key}"),) if nbytes else ()
    # Made while unpickling (a tensor rebuilt from data inside the pickle): real memory.
    return (Data(_storage_bytes(storage)),) if nbytes else ()


def _storage_bytes(storage: Any) -> bytes:
    import torch

    whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    return bytes(whole.numpy().tobytes())


def _dense_bytes(source: int, record_start: int, slot: Slot) -> bytes:
    """A strided view's values in dense order: read its span from IN, copy it dense."""
    import torch

    span = torch.empty(slot.source_nbytes, dtype=torch.uint8)
    pread_into(source, host_bytes(span), record_start + slot.source_start)
    view = slot.views[0]
    _, offset, shape, stride, dtype = view.source
    values = torch.empty(0, dtype=torch_dtype(dtype))
    values.set_(span.untyped_storage(), offset - slot.source_start // view.itemsize, shape, stride)
    dense = torch.empty(slot.nbytes, dtype=torch.uint8)
    target = torch.empty(0, dtype=torch_dtype(dtype))
    target.set_(dense.untyped_storage(), 0, view.shape, view.stride)
    as_bits(target).copy_(as_bits(values))
    return bytes(dense.numpy().tobytes())


def _torch_reads(path: str, options: FlattenOptions, tree: Any) -> None:
    """torch.load(OUT, mmap=True) opens OUT and finds the tensors of the tree that was pickled."""
    import torch

    # A script's classes are looked up where --main-module defines them, as IN's were.
    resolving = {} if options.main_module is None else {
        "pickle_module": pickle_module_resolving_main(options.main_module)
    }
    try:
        loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=not options.trust, **resolving)
    except Exception as exc:
        raise FlattenError(f"verification failed: torch.load cannot read OUT: {str(exc).splitlines()[0]}") from exc

    def layouts(obj: Any) -> list[tuple[Any, ...]]:
        return [(t.dtype, tuple(t.shape), t.stride(), t.storage_offset()) for t in walk_tensors(obj)]

    if layouts(loaded) != layouts(tree):
        raise FlattenError("verification failed: torch.load reads other tensors from OUT than were written")


def _through_memory(job: FlattenJob, tree: Any, stand_ins: Any, spans: RecordSpans) -> Written:
    """Fill device buffers from IN's file, re-point the tree at them, and torch.save it (CUDA)."""
    names = {name for tensor in job.facts.tensors for name in tensor.names}
    buffers = allocate(job.plan)
    copied = copy_from_file(job.plan, buffers, job.path, spans.starts)
    rebind(tree, job.plan, views_of(job.plan, buffers), stand_ins.key_of)
    # On CUDA, cuDNN lays out each RNN itself and its buffer is what gets saved.
    plan, buffers, _ = adopt_cudnn_layouts(tree, job.plan, buffers, job.facts)
    from_main = classes_from_main(job.source.pickle_globals)
    verify = (
        (lambda temporary: verify_torch_file(temporary, plan, buffers, names, from_main=from_main))
        if job.options.verify else None
    )
    verified = write_torch(tree, job.out, verify, from_main=job.objects_from_main())
    return Written(copied, verified, (BUFFERS_WRITTEN, LAYOUT, *((MAIN_NAMES,) if from_main else ())))


WRITER = TorchZipWriter()
