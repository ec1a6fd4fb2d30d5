"""Conversion to safetensors (`flatten --to safetensors`): a pickle's tensors, written flat, nothing executed.

IN is read as every flatten reads it: the restricted unpickler gives the records,
and the plan groups them. Then, as flatten's torch.save writer does, OUT is
streamed: a tensor whose bytes lie in IN as OUT stores them moves file to file in
the kernel, and only a view that must be made dense is gathered through memory,
one at a time. OUT is a standard safetensors file with `__metadata__["format"] = "pt"`, as
transformers writes it, its data section starting on a 64-byte boundary and its
tensors sorted by element size (so each is aligned without the gaps the format
forbids).

safetensors holds no views, so sharing is written as the Hugging Face tools write it:

- names of one view (a tie such as `lm_head.weight = transformer.wte.weight`) are
  stored once. The others are dropped and recorded in `__metadata__` as
  `{dropped: kept}`, exactly what `safetensors.torch.save_model` records, and the
  model's own tie brings them back on load (`safetensors.torch.load_model`,
  transformers' `_tied_weights_keys`). The name kept is a declared tie's source
  (the input embedding, which transformers keeps), else the first in sorted order
  (save_model's choice).
- a view that only overlaps another (a slice, a transpose) cannot be a tie a model
  restores: it is stored as its own dense copy, and the summary says so.
- a declared tie that IN itself has already lost (two separate copies) stays two
  tensors: it is reported, not re-tied.

Anything that is not a tensor (optimizer hyper-parameters, step counters, a pickled
module's objects) has no place in safetensors: it is listed and refused unless
`--tensors-only` asks to leave it out.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from memlayout.core.facts import Facts
from memlayout.core.flatten_support import SAFETENSORS_CONVERSION
from memlayout.core.strides import MemoryFormat
from memlayout.dtypes import dtype_info
from memlayout.errors import FlattenError, UsageError
from memlayout.flatten.apply import host_bytes, torch_dtype
from memlayout.flatten.options import FlattenOptions
from memlayout.flatten.pickle_contents import non_tensor_contents
from memlayout.flatten.plan import FlatPlan, Placement, ViewKey, dense_strides, view_key
from memlayout.flatten.verification import CONVERTED_COPIES, CONVERTED_DENSE, CONVERTED_HEADER
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, LayoutAfter, Written
from memlayout.flatten.writers.safetensors import ordered_header
from memlayout.io.atomic_write import atomic_file
from memlayout.load.records import LoadedSource
from memlayout.load.safetensors_file import MEMLAYOUT_ALIASES_KEY, read_header

if TYPE_CHECKING:
    import torch

TARGET = "safetensors"
FORMAT_METADATA = {"format": "pt"}
"""What transformers' save_pretrained writes in every file (tests/flatten/test_to_safetensors_hf.py checks it)."""
DATA_ALIGN = 64
COPY_CHUNK_BYTES = 8 << 20
SHOWN = 5
"""How many names a refusal or a note lists before "and N more"."""
_LABELS = {
    "torch-zip": "torch.save zip",
    "torch-legacy": "legacy torch.save file",
    "safetensors": "safetensors file",
}
_UNCONVERTED = {
    "torch-legacy-tar": "write a current torch.save zip first (`memlayout flatten IN -o current.pt`), then convert "
                        "that",
    "torchscript": "a TorchScript archive holds code; save the module's state_dict() with torch.save and convert that",
    "torch-export": "save the program's state_dict with torch.save and convert that",
}


class Stored(NamedTuple):
    """One tensor of OUT, in data order."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    view: ViewKey
    """IN's view whose values it holds."""
    source_range: tuple[str, int] | None
    """(IN's storage key, byte start) when its bytes lie in IN exactly as OUT stores them, so they
    move file to file; None when they are gathered dense from the view."""


class SafetensorsLayout(NamedTuple):
    """What OUT holds, decided from the plan alone (for --check, the summary and the write)."""

    stored: tuple[Stored, ...]
    dropped: dict[str, str]
    """Tied name -> the stored name it is a view of (save_model's metadata)."""
    copied: tuple[tuple[str, str], ...]
    """(name, a name it shares memory with in IN): views stored as their own copies."""
    header: bytes
    """The JSON header, padded with spaces so the data section starts on DATA_ALIGN bytes."""


def _kept_name(names: tuple[str, ...], sources: set[str], targets: set[str]) -> str:
    # transformers drops the tie's target (lm_head.weight) and rebuilds it from the
    # source on load; save_model keeps the first name in sorted order.
    return min(names, key=lambda n: (n not in sources, n in targets, n))


def _is_whole_slot(placement: Placement, start: int, nbytes: int) -> bool:
    return (
        placement.stride == dense_strides(placement.shape, MemoryFormat.CONTIGUOUS)
        and placement.offset * placement.itemsize == start
        and placement.itemsize * _numel(placement.shape) == nbytes
    )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def safetensors_layout(plan: FlatPlan, facts: Facts, metadata: dict[str, str] | None = None) -> SafetensorsLayout:
    """Decide OUT's tensors, names and header from the plan; touches no bytes.

    Args:
        plan: The plan made from IN's facts (CPU buffers).
        facts: IN's facts (declared ties decide which name of a tie is kept).
        metadata: `__metadata__` strings to keep from IN (a safetensors IN's own).

    Returns:
        The tensors in data order, the dropped tied names and the views stored as copies.

    Raises:
        FlattenError: a dtype safetensors has no code for.
    """
    sources = {tie.source for tie in facts.declared_ties}
    targets = {tie.target for tie in facts.declared_ties}
    stored: list[Stored] = []
    dropped: dict[str, str] = {}
    copied: list[tuple[str, str]] = []

    def store(
        placement_names: tuple[str, ...], dtype: str, shape: tuple[int, ...], key: ViewKey,
        source_range: tuple[str, int] | None,
    ) -> str:
        kept = _kept_name(placement_names, sources, targets)
        stored.append(Stored(kept, dtype, shape, dtype_info(dtype).itemsize * _numel(shape), key, source_range))
        dropped.update({name: kept for name in placement_names if name != kept})
        return kept

    for flat in plan.buffers:
        for slot in flat.slots:
            owner = next((p for p in slot.views if _is_whole_slot(p, slot.start, slot.nbytes)), None)
            first = None
            if owner is not None:
                # A slot copied byte for byte is one range of IN; a dense slot gathers a strided view.
                where = None if slot.dense else (slot.source_storage, slot.source_start)
                first = store(owner.names, owner.dtype, owner.shape, owner.source, where)
            for placement in slot.views:
                if placement is owner:
                    continue
                kept = store(placement.names, placement.dtype, placement.shape, placement.source, None)
                if first is None:
                    first = kept
                elif len(slot.views) > 1:
                    copied.append((kept, first))
    by_key = {view_key(t, facts): t for t in facts.tensors}
    for key in plan.untouched:
        # Empty tensors, and weights a weight-dropout wrapper recomputes: still IN's tensors.
        tensor = by_key[key]
        store(tensor.names, tensor.dtype, tensor.shape, key, None)
    header = ordered_header(stored)  # sorts `stored` into data order
    # Dropped names map to the kept one, as save_model records them; "format" last, always "pt".
    header["__metadata__"] = {**(metadata or {}), **{n: k for n, k in dropped.items() if n not in (metadata or {})},
                              **FORMAT_METADATA}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % (plan.asked_align or DATA_ALIGN))
    return SafetensorsLayout(tuple(stored), dropped, tuple(copied), raw)


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def lost_ties(facts: Facts) -> list[str]:
    """Ties IN declares whose two names are separate memory in IN: written apart, not re-tied.

    Args:
        facts: IN's facts.

    Returns:
        One note per lost tie.
    """
    notes = []
    for tie in facts.declared_ties:
        target, source = facts.tensor(tie.target), facts.tensor(tie.source)
        if target is None or source is None or target is source:
            continue
        notes.append(
            f"lost tie: {tie.target} is declared tied to {tie.source} ({tie.declared_by}), but IN stores them "
            "apart; OUT keeps both as IN has them, not re-tied (re-tie in the model and re-save to store it once)"
        )
    return notes


class SafetensorsConverter(FlattenWriter):
    """Writes any pickle or safetensors file memlayout reads as flat safetensors, ties stored once."""

    formats = SAFETENSORS_CONVERSION
    target = TARGET

    def label(self, source: LoadedSource) -> str:
        return f"{_LABELS[source.format]} -> safetensors"

    def admit(self, source: LoadedSource, facts: Facts, options: FlattenOptions) -> tuple[str, ...]:
        """Refuse what safetensors cannot hold; else the notes on what is left out or kept apart."""
        notes = lost_ties(facts)
        others = non_tensor_contents(source)
        if others and not options.tensors_only:
            raise UsageError(
                f"{source.path} holds {len(others)} value(s) that are not tensors, which safetensors cannot store: "
                f"{_listed(others)}",
                "pass --tensors-only to write only its tensors, or save the model's state_dict() alone",
            )
        if others:
            notes.insert(0, f"not written (--tensors-only): {_listed(others)}")
        return tuple(notes)

    def changes(self, plan: FlatPlan, facts: Facts, source: LoadedSource) -> list[str]:
        layout = safetensors_layout(plan, facts, _kept_metadata(source))
        lines = [f"the format changes: {_LABELS[source.format]} -> safetensors (metadata format: pt)"]
        if source.format == "safetensors" and _already_converted(source, layout):
            return []
        if layout.dropped:
            pairs = [f"{name} -> {kept}" for name, kept in sorted(layout.dropped.items())]
            lines.append(
                f"{len(pairs)} tied name(s) stored once and recorded in __metadata__, restored on load by the "
                f"model's own tie (as safetensors.torch.save_model stores them): {_listed(pairs)}"
            )
        if layout.copied:
            pairs = [f"{name} (shares memory with {other})" for name, other in layout.copied]
            lines.append(f"{len(pairs)} overlapping view(s) stored as their own copies, since safetensors has no "
                         f"views: {_listed(pairs)}")
        return lines

    def layout_after(self, plan: FlatPlan, facts: Facts) -> LayoutAfter:
        # One data section, tensors back to back: the format allows no padding.
        nbytes = sum(entry.nbytes for entry in safetensors_layout(plan, facts).stored)
        return LayoutAfter(1 if nbytes else 0, nbytes, 0)

    def refuse(self, source: LoadedSource, options: FlattenOptions, device: str | None) -> None:
        if device not in (None, "cpu"):
            raise UsageError("safetensors records no device: conversion writes from the CPU",
                             "pass --device cpu, or no --device")

    def declines(self, source_format: str, path: str) -> FlattenError:
        hint = _UNCONVERTED.get(source_format, "convert a torch.save file or a safetensors file")
        return FlattenError(f"{path}: --to safetensors does not convert {source_format} sources", hint)

    def write(self, job: FlattenJob) -> Written:
        layout = safetensors_layout(job.plan, job.facts, _kept_metadata(job.source))
        reader: Any = job.source.reader
        if reader is None or reader.file_of:
            raise FlattenError(f"{job.path}: its tensors' bytes are not located in one file", "convert each file alone")
        stages: dict[str, float] = {}
        verified = False
        source = os.open(job.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            with atomic_file(job.out) as output:
                started = time.perf_counter()
                copied = _write_file(output.path, layout, source, reader)
                stages["copy"] = time.perf_counter() - started
                if job.options.verify and not output.is_stream:
                    started = time.perf_counter()
                    _verify(output.path, layout, source, reader)
                    stages["verify"] = time.perf_counter() - started
                    verified = True
                closing = time.perf_counter()
            stages["fsync"] = time.perf_counter() - closing
        finally:
            os.close(source)
        dense = any(entry.source_range is None and entry.nbytes for entry in layout.stored)
        copies = any(entry.source_range is not None and entry.nbytes for entry in layout.stored)
        checks = (*((CONVERTED_COPIES,) if copies else ()), *((CONVERTED_DENSE,) if dense else ()), CONVERTED_HEADER)
        return Written(copied, verified, checks, stages)


def _kept_metadata(source: LoadedSource) -> dict[str, str]:
    """A safetensors IN's own metadata, less memlayout's aliases (written as ties instead)."""
    if source.format != "safetensors" or source.path is None:
        return {}
    header, _ = read_header(source.path)
    return {k: v for k, v in header.metadata.items() if k != MEMLAYOUT_ALIASES_KEY}


def _already_converted(source: LoadedSource, layout: SafetensorsLayout) -> bool:
    """A safetensors IN that conversion would write byte for byte: same header, same order."""
    assert source.path is not None
    with open(source.path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return length == len(layout.header) and handle.read(length) == layout.header


def _gathered(reader: Any, view: ViewKey) -> torch.Tensor:
    """A view of IN's storage, read from the file and made dense: only its own span is read."""
    import torch

    key, offset, shape, stride, dtype = view
    itemsize = dtype_info(dtype).itemsize
    if _numel(shape) == 0:
        return torch.empty(shape, dtype=torch_dtype(dtype))
    last = offset + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    span = torch.empty((last - offset + 1) * itemsize, dtype=torch.uint8)
    reader.read_into(key, offset * itemsize, host_bytes(span))
    values = torch.empty(0, dtype=torch_dtype(dtype)).set_(span.untyped_storage(), 0, shape, stride)
    return values.contiguous()


def _dense_bytes(value: torch.Tensor) -> memoryview:
    import torch

    raw = torch.empty(0, dtype=torch.uint8)
    raw.set_(value.untyped_storage(), value.storage_offset() * value.element_size(),
             (value.numel() * value.element_size(),), (1,))
    return host_bytes(raw)


def _write_all(target: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(target, view) :]


def _copy_range(source: int, target: int, start: int, nbytes: int) -> None:
    """IN's bytes [start, start + nbytes) appended to OUT, in the kernel where it can."""
    done = 0
    try:
        position = os.lseek(target, 0, os.SEEK_CUR)
        while done < nbytes:
            moved = os.copy_file_range(source, target, nbytes - done, start + done, position + done)
            if moved == 0:
                raise FlattenError("IN ended before the bytes its records name", "the file changed while it was read")
            done += moved
        os.lseek(target, position + nbytes, os.SEEK_SET)
        return
    except OSError:
        # A pipe, a filesystem pair or a kernel without it: the same bytes through memory.
        if done:
            os.lseek(target, position + done, os.SEEK_SET)
    while done < nbytes:
        chunk = os.pread(source, min(COPY_CHUNK_BYTES, nbytes - done), start + done)
        if not chunk:
            raise FlattenError("IN ended before the bytes its records name", "the file changed while it was read")
        _write_all(target, chunk)
        done += len(chunk)


def _write_file(path: str, layout: SafetensorsLayout, source: int, reader: Any) -> int:
    """Write OUT: its header, then each tensor, moved from IN's file or gathered dense. Returns bytes written."""
    copied = 0
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        _write_all(out, struct.pack("<Q", len(layout.header)) + layout.header)
        for entry in layout.stored:
            if not entry.nbytes:
                continue
            if entry.source_range is not None:
                key, start = entry.source_range
                _copy_range(source, out, reader.starts[key] + start, entry.nbytes)
            else:
                _write_all(out, _dense_bytes(_gathered(reader, entry.view)))
            copied += entry.nbytes
        if stat.S_ISREG(os.fstat(out).st_mode):  # a pipe or a terminal has nothing to sync
            os.fsync(out)
    finally:
        os.close(out)
    return copied


def _verify(path: str, layout: SafetensorsLayout, source: int, reader: Any) -> None:
    """Re-read OUT: its header as `inspect` validates it, its ties, and every tensor's bytes against IN's."""
    header, _ = read_header(path)
    expected = [(s.name, s.nbytes) for s in layout.stored]
    if header.metadata.get("format") != "pt" or [(e.name, e.nbytes) for e in header.entries] != expected:
        raise FlattenError("verification failed: OUT's header is not the one written")
    for name, kept in layout.dropped.items():
        if header.metadata.get(name) != kept:
            raise FlattenError(f"verification failed: the tie {name} -> {kept} is not recorded in OUT")
    written = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        for entry, recorded in zip(layout.stored, header.entries, strict=True):
            if entry.source_range is not None:
                key, start = entry.source_range
                same = _same_ranges(source, reader.starts[key] + start, written, recorded.start, entry.nbytes)
            else:
                wanted = bytes(_dense_bytes(_gathered(reader, entry.view))) if entry.nbytes else b""
                same = os.pread(written, entry.nbytes, recorded.start) == wanted
            if not same:
                raise FlattenError(f"verification failed: {entry.name} differs in the written file")
    finally:
        os.close(written)


def _same_ranges(first: int, first_start: int, second: int, second_start: int, nbytes: int) -> bool:
    done = 0
    while done < nbytes:
        length = min(COPY_CHUNK_BYTES, nbytes - done)
        left = os.pread(first, length, first_start + done)
        if len(left) != length or left != os.pread(second, length, second_start + done):
            return False
        done += length
    return True


WRITER = SafetensorsConverter()

__all__ = ["WRITER", "SafetensorsConverter", "lost_ties", "safetensors_layout"]
