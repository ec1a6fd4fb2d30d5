"""safetensors files rewritten flat: in flat-buffer order, ties as metadata aliases, CPU only.

safetensors stores one data section of dense, non-overlapping tensors and no
aliasing. A flat file keeps each buffer's tensors together in slot order (buffers
sorted by element size, so every tensor stays naturally aligned without padding,
which the format forbids as a hole). A tie is stored once; its other names, and
any strided view, go to `__metadata__["memlayout.aliases"]` as (stored name, element
offset, shape, stride, dtype), which `memlayout.flatten.load_flat` turns back into
views. The header is padded with spaces so the data section starts on a 64-byte boundary
(or on `--align` bytes, when asked).

A file already laid out as this rewrite would lay it out is left as it is (copied
byte for byte), and its data section is judged by the format's own standard:
safetensors' writer starts it on 8 bytes, which with the largest elements first
puts every tensor on a multiple of its element size. 64 bytes (for mmap and DMA)
is asked for with `--align 64` or `alignment = 64` in `[tool.memlayout]`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.core.facts import Facts
from memlayout.core.flatten_support import SAFETENSORS_SECTION_ALIGNMENT
from memlayout.core.strides import MemoryFormat
from memlayout.dtypes import SAFETENSORS_DTYPES, dtype_info
from memlayout.errors import FlattenError, UsageError
from memlayout.flatten.apply import allocate, as_bits, copy_from_file, view_of
from memlayout.flatten.load_flat import load_flat_safetensors
from memlayout.flatten.options import FlattenOptions
from memlayout.flatten.plan import FlatPlan, Slot, dense_strides
from memlayout.flatten.verification import BYTE_FOR_BYTE, SAFETENSORS_TENSORS
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, LayoutAfter, Written
from memlayout.format_bytes import counted
from memlayout.io.atomic_write import atomic_file
from memlayout.load.records import LoadedSource
from memlayout.load.safetensors_file import MEMLAYOUT_ALIASES_KEY as ALIASES_KEY
from memlayout.load.safetensors_file import read_header

if TYPE_CHECKING:
    import torch

DATA_ALIGN = 64
COPY_CHUNK_BYTES = 8 << 20
_CODES = {name: code for code, name in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    buffer: int
    start: int
    nbytes: int


def _slot_entries(index: int, number: int, slot: Slot) -> tuple[_Entry, dict[str, Any]]:
    # Store the view that covers the whole slot densely, else the raw bytes.
    owner = next(
        (
            v for v in slot.views
            if v.stride == dense_strides(v.shape, MemoryFormat.CONTIGUOUS)
            and v.offset * v.itemsize == slot.start
            and v.itemsize * _numel(v.shape) == slot.nbytes
        ),
        None,
    )
    if owner is not None:
        entry = _Entry(owner.names[0], owner.dtype, owner.shape, index, slot.start, slot.nbytes)
    else:
        entry = _Entry(f"__memlayout_slot_{index}_{number}", "uint8", (slot.nbytes,), index, slot.start, slot.nbytes)
    aliases = {}
    for view in slot.views:
        for name in view.names:
            if name == entry.name:
                continue
            relative = view.offset * view.itemsize - slot.start
            aliases[name] = {
                "of": entry.name, "offset": relative // view.itemsize,
                "shape": list(view.shape), "stride": list(view.stride), "dtype": view.dtype,
            }
    return entry, aliases


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def ordered_header(entries: list[Any]) -> dict[str, Any]:
    """The safetensors header items of `entries`, which it sorts in place into data order.

    Largest elements first: every tensor then starts on a multiple of its element
    size, with no padding between tensors (which safetensors forbids). Both flatten's
    safetensors output and the conversion to safetensors lay their headers out here.

    Raises:
        FlattenError: a dtype safetensors has no code for.
    """
    entries.sort(key=lambda e: -dtype_info(e.dtype).itemsize)
    header: dict[str, Any] = {}
    cursor = 0
    for entry in entries:
        code = _CODES.get(entry.dtype)
        if code is None:
            raise FlattenError(f"{entry.name}: dtype {entry.dtype} has no safetensors code")
        header[entry.name] = {"dtype": code, "shape": list(entry.shape),
                              "data_offsets": [cursor, cursor + entry.nbytes]}
        cursor += entry.nbytes
    return header


@dataclass(frozen=True)
class FlatHeader:
    """The header a flat rewrite writes, and the entries of its data section in order."""

    raw: bytes
    """The JSON header, padded with spaces so the data section starts on DATA_ALIGN bytes."""
    entries: list[_Entry]
    """What the data section holds, in file order."""
    aliases: dict[str, Any]
    """Names stored as views of an entry (ties, strided views), as `__metadata__` records them."""


def flat_header(plan: FlatPlan, metadata: dict[str, str] | None = None) -> FlatHeader:
    """The header and data order a flat rewrite gives, computed without touching any bytes.

    Args:
        plan: The layout.
        metadata: `__metadata__` strings to keep (e.g. {"format": "pt"}).

    Returns:
        The padded header and the entries in data order (by element size, largest
        first, so that every tensor stays naturally aligned without a gap).
    """
    entries: list[_Entry] = []
    aliases: dict[str, Any] = {}
    for index, flat in enumerate(plan.buffers):
        for number, slot in enumerate(flat.slots):
            if slot.nbytes == 0 and not slot.views[0].shape:
                continue
            entry, slot_aliases = _slot_entries(index, number, slot)
            entries.append(entry)
            aliases.update(slot_aliases)
    header = ordered_header(entries)
    meta = dict(metadata or {})
    if aliases:
        meta[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    if meta:
        header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % (plan.asked_align or DATA_ALIGN))
    return FlatHeader(raw, entries, aliases)


def write_flat_safetensors(
    path: str, plan: FlatPlan, buffers: list[torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write the flat buffers as a standard safetensors file, ties as metadata aliases.

    Args:
        path: Destination (write to a temporary and rename; see `memlayout.io.atomic_write`).
        plan: The layout.
        buffers: The filled buffers (any device).
        metadata: `__metadata__` strings to keep (e.g. {"format": "pt"}).
    """
    planned = flat_header(plan, metadata)
    raw, entries = planned.raw, planned.entries
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for entry in entries:
            chunk = buffers[entry.buffer][entry.start : entry.start + entry.nbytes]
            out.write(chunk.cpu().numpy().tobytes() if chunk.device.type != "cpu" else memoryview(chunk.numpy()))  # type: ignore[arg-type]
        out.flush()
        os.fsync(out.fileno())


def safetensors_changes(plan: FlatPlan, source: LoadedSource) -> list[str]:
    """What rewriting a safetensors file flat would change; empty when it is already flat.

    A safetensors data section is one mapped buffer with no gaps, so flat means:
    tensors in the order the flat rewrite uses, the data section where the format
    puts it (8 bytes, safetensors' own standard) or where `--align` asks, and the
    same alias metadata. An already flat file is copied byte for byte, so "already
    flat" promises an identical OUT.

    Args:
        plan: The plan made from the file's facts.
        source: The file's loaded metadata.

    Returns:
        One line per change.
    """
    assert source.path is not None
    header, _ = read_header(source.path)
    metadata = {k: v for k, v in header.metadata.items() if k != ALIASES_KEY}
    planned = flat_header(plan, metadata)
    lines = []
    order = [entry.name for entry in planned.entries]
    current = [entry.name for entry in header.entries]
    if order != current:
        moved = sum(1 for a, b in zip(order, current, strict=False) if a != b) + abs(len(order) - len(current))
        lines.append(f"{moved} of {counted(len(current), 'tensor')} move to keep each dtype group together in flat "
                     "order")
    wanted = plan.asked_align or SAFETENSORS_SECTION_ALIGNMENT
    if header.data_start % wanted:
        why = "as --align asks" if plan.asked_align else "as safetensors' own writer does"
        lines.append(
            f"the data section starts at byte {header.data_start}, only {header.data_start & -header.data_start}-byte "
            f"aligned; the header is padded to start it on a {plan.asked_align or DATA_ALIGN}-byte boundary "
            f"({why}), which moves every tensor's file offset"
        )
    if planned.aliases != json.loads(header.metadata.get(ALIASES_KEY, "{}")):
        lines.append(
            f"{counted(len(planned.aliases), 'tie or strided view', 'ties and strided views')} recorded in "
            f"__metadata__[{ALIASES_KEY!r}]"
        )
    return lines


def flatten_safetensors_file(
    path: str, out: str, source: LoadedSource, plan: FlatPlan, verify: bool
) -> tuple[int, bool, tuple[str, ...]]:
    """Rewrite a safetensors file in flat-buffer order, verified, atomically.

    A file that is already flat (`safetensors_changes` is empty) is copied byte
    for byte, so that "OUT is a verified copy" is literally true; otherwise the
    header is rewritten and the tensors are moved into flat order.

    Args:
        path: IN.
        out: OUT.
        source: IN's loaded metadata (its storages' base addresses give file offsets).
        plan: The layout (CPU buffers).
        verify: Reload OUT and compare every tensor's bytes before renaming.

    Returns:
        (bytes copied, whether OUT was verified, what the check proved).
    """
    import torch

    if not safetensors_changes(plan, source):
        return (*_copy_verified(path, out, verify), (BYTE_FOR_BYTE,))
    header, _ = read_header(path)
    offsets = {key: storage.base_address for key, storage in source.storages.items()
               if storage.base_address is not None}
    buffers = allocate(plan)
    copied = copy_from_file(plan, buffers, path, offsets)
    metadata = {k: v for k, v in header.metadata.items() if k != ALIASES_KEY}
    with atomic_file(out) as output:
        temporary = output.path
        write_flat_safetensors(temporary, plan, buffers, metadata)
        # A device or pipe is written straight into and cannot be re-read.
        verify = verify and not output.is_stream
        if verify:
            written = load_flat_safetensors(temporary)
            for index, placement in plan.placements.values():
                expected = view_of(buffers[index], placement)
                for name in placement.names:
                    got = written.get(name)
                    if got is None or got.shape != expected.shape or not torch.equal(as_bits(got), as_bits(expected)):
                        raise FlattenError(f"verification failed: {name} differs in the written file")
            del written
    return copied, verify, (SAFETENSORS_TENSORS,)


def _copy_verified(path: str, out: str, verify: bool) -> tuple[int, bool]:
    """Copy IN to OUT byte for byte, atomically, and compare OUT with IN before committing."""
    with atomic_file(out) as output:
        with open(path, "rb") as source, output.open() as target:
            shutil.copyfileobj(source, target, COPY_CHUNK_BYTES)
        copied = os.path.getsize(path)
        verify = verify and not output.is_stream
        if verify and not _same_bytes(path, output.path):
            raise FlattenError(f"verification failed: the copy of {path} differs from it")
    return copied, verify


def _same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as first, open(b, "rb") as second:
        while True:
            left, right = first.read(COPY_CHUNK_BYTES), second.read(COPY_CHUNK_BYTES)
            if left != right:
                return False
            if not left:
                return True


class SafetensorsWriter(FlattenWriter):
    """Writes the tensors in flat order with ties as metadata aliases; CPU only."""

    formats = ("safetensors",)

    def changes(self, plan: FlatPlan, facts: Facts, source: LoadedSource) -> list[str]:
        return safetensors_changes(plan, source)

    def layout_after(self, plan: FlatPlan, facts: Facts) -> LayoutAfter:
        # One data section, tensors back to back: the format allows no padding.
        nbytes = sum(slot.nbytes for flat in plan.buffers for slot in flat.slots)
        return LayoutAfter(1 if nbytes else 0, nbytes, 0)

    def refuse(self, source: LoadedSource, options: FlattenOptions, device: str | None) -> None:
        # safetensors records no device: its tensors are the CPU's, kept or moved there.
        if device not in (None, "cpu"):
            raise UsageError("a safetensors file is rewritten on the CPU", "pass --device cpu, or no --device")

    def write(self, job: FlattenJob) -> Written:
        copied, verified, checks = flatten_safetensors_file(job.path, job.out, job.source, job.plan, job.options.verify)
        return Written(copied, verified, checks)


WRITER = SafetensorsWriter()
