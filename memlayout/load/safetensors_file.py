"""safetensors files, read from the header alone, without torch.

A file is an 8-byte little-endian header length, a JSON header, and a data
section. Each header entry names a dtype, a shape and `data_offsets` relative to
the data section. The data section is one mapped buffer: `safe_open` maps the file
once and every tensor it returns points into that mapping at its file offset. So
the data section is one `StorageRecord` whose `base_address` is its absolute file
offset, and each tensor is a view at its element offset (ML203 then checks
alignment as the bytes sit in the mapping, and ML204 sees one buffer, as flatten
does). A tensor whose byte offset is no multiple of its element size cannot be
an element offset of that storage; it gets a storage of its own at its file offset.

Validation follows what the safetensors library itself refuses: a header length
beyond the file, invalid JSON, unknown dtypes, offsets outside the data section,
a shape that does not match the byte count, overlapping ranges, and holes or
trailing bytes in the data section. Holes are errors rather than notes because
`safetensors.safe_open` rejects such a file ("InvalidOffset" /
"MetadataIncompleteBuffer"), so a file with holes is not loadable as written.

A file stores each tie once. Two writers record, in `__metadata__`, which names
the loader brings back: `safetensors.torch.save_model` maps each name it dropped
to the name it kept (`{"transformer.wte.weight": "lm_head.weight"}`), and
`memlayout flatten` lists its aliases under `memlayout.aliases`. Both become
declared ties, so a missing name that the file's own metadata restores is not a
lost tie.
"""

from __future__ import annotations

import os
import struct
from typing import Any, NamedTuple

import orjson

from memlayout.dtypes import SAFETENSORS_DTYPES, dtype_info
from memlayout.errors import CorruptCheckpointError
from memlayout.load.detect import (
    SAFETENSORS_HEADER_LENGTH_BYTES,
    SAFETENSORS_MAX_HEADER_BYTES,
)
from memlayout.load.file_source import StorageSpans, file_source
from memlayout.load.records import (
    DeclaredTie,
    LoadedSource,
    StorageRecord,
    TensorKind,
    TensorRecord,
)

HEADER_LENGTH_BYTES = SAFETENSORS_HEADER_LENGTH_BYTES
MAX_HEADER_BYTES = SAFETENSORS_MAX_HEADER_BYTES
METADATA_KEY = "__metadata__"
MEMLAYOUT_ALIASES_KEY = "memlayout.aliases"

# Sub-byte dtypes: safetensors counts 4-bit elements; torch packs two per byte
# (float4_e2m1fn_x2), so the torch shape halves the last dimension.
_PACKED_DTYPES: dict[str, tuple[str, int]] = {"F4": ("float4_e2m1fn_x2", 2)}


class SafetensorsEntry(NamedTuple):
    """One header entry, validated (a NamedTuple: a sharded checkpoint has 100,000)."""

    name: str
    dtype: str
    """torch's short dtype name."""
    shape: tuple[int, ...]
    """Shape in torch's terms (packed dtypes already halved)."""
    start: int
    """Absolute file offset of the first byte."""
    nbytes: int


class SafetensorsHeader(NamedTuple):
    """A parsed and validated header."""

    entries: list[SafetensorsEntry]
    metadata: dict[str, str]
    data_start: int
    """Absolute file offset of the data section (8 + header length)."""


def _fail(path: str, problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path}: invalid safetensors header: {problem}",
        "the file is damaged or was not written by safetensors; re-export it with safetensors.torch.save_file",
    )


def _torch_shape(path: str, name: str, code: Any, shape: Any) -> tuple[str, tuple[int, ...], int]:
    """(torch dtype, torch shape, expected bytes) of one entry."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _fail(path, f"tensor {name!r} has shape {shape!r}; expected a list of non-negative ints")
    if not isinstance(code, str):
        raise _fail(path, f"tensor {name!r} has dtype {code!r}; expected a dtype name")
    count = 1
    for dim in shape:
        count *= dim
    if code in _PACKED_DTYPES:
        dtype, per_byte = _PACKED_DTYPES[code]
        if not shape or shape[-1] % per_byte:
            raise _fail(path, f"tensor {name!r} of packed dtype {code} has an odd last dimension {shape!r}")
        return dtype, (*shape[:-1], shape[-1] // per_byte), count // per_byte
    torch_dtype = SAFETENSORS_DTYPES.get(code)
    if torch_dtype is None:
        raise _fail(path, f"tensor {name!r} has unknown dtype {code!r}")
    return torch_dtype, tuple(shape), count * dtype_info(torch_dtype).itemsize


def parse_header(path: str, raw: bytes | memoryview, file_size: int) -> SafetensorsHeader:
    """Validate a safetensors header as the safetensors library would.

    Args:
        path: The file, for messages.
        raw: At least the first 8 + header-length bytes of the file.
        file_size: The file's size in bytes.

    Returns:
        The entries sorted by file offset, the `__metadata__` strings, and where
        the data section starts.

    Raises:
        CorruptCheckpointError: any inconsistency, naming the first one found.
    """
    if file_size < HEADER_LENGTH_BYTES:
        raise _fail(path, f"the file is {file_size} bytes, too short for the 8-byte header length")
    (length,) = struct.unpack("<Q", bytes(raw[:HEADER_LENGTH_BYTES]))
    if length > MAX_HEADER_BYTES or HEADER_LENGTH_BYTES + length > file_size:
        raise _fail(path, f"the header claims {length} bytes but the file has {file_size - HEADER_LENGTH_BYTES} after "
                          "the length")
    data_start = HEADER_LENGTH_BYTES + length
    try:
        # orjson, as strict as the safetensors crate's serde_json (UTF-8 only, no
        # NaN); a 100,000-tensor checkpoint's headers parse several times faster.
        header = orjson.loads(bytes(raw[HEADER_LENGTH_BYTES:data_start]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(path, f"the header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _fail(path, "the header is not a JSON object")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _fail(path, "__metadata__ must map strings to strings")

    data_size = file_size - data_start
    entries: list[SafetensorsEntry] = []
    # A model repeats a few (dtype, shape) pairs; each is validated once and its
    # torch terms shared by every entry that has it.
    known: dict[tuple[object, ...], tuple[str, tuple[int, ...], int]] = {}
    for name, info in header.items():
        if type(info) is not dict:
            raise _fail(path, f"entry {name!r} is not an object")
        code, shape_list = info.get("dtype"), info.get("shape")
        pair: tuple[object, ...] | None = None
        torch_terms = None
        if type(shape_list) is list:
            # 8.0 and True hash as 8 and 1: only a shape of exact ints may hit.
            for dim in shape_list:
                if type(dim) is not int:
                    break
            else:
                pair = (code, *shape_list)
                try:
                    torch_terms = known.get(pair)
                except TypeError:  # an unhashable dtype: validated below
                    pair = None
        if torch_terms is None:
            torch_terms = _torch_shape(path, name, code, shape_list)
            if pair is not None:
                known[pair] = torch_terms
        dtype, shape, expected = torch_terms
        offsets = info.get("data_offsets")
        if not (type(offsets) is list and len(offsets) == 2 and type(offsets[0]) is int and type(offsets[1]) is int):
            raise _fail(path, f"tensor {name!r} has data_offsets {offsets!r}; expected [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            raise _fail(path, f"tensor {name!r} has data_offsets [{begin}, {end}] outside the {data_size}-byte data "
                              "section")
        if end - begin != expected:
            raise _fail(path, f"tensor {name!r} {info.get('dtype')}{info.get('shape')} needs {expected} bytes but its "
                              f"offsets span {end - begin}")
        entries.append(SafetensorsEntry(name, dtype, shape, data_start + begin, end - begin))

    entries.sort(key=lambda e: (e.start, e.nbytes))
    cursor = data_start
    previous = "the header"
    for entry in entries:
        if entry.start < cursor:
            raise _fail(path, f"tensor {entry.name!r} overlaps {previous}")
        if entry.start > cursor:
            raise _fail(path, f"{entry.start - cursor} unused bytes (a hole) before tensor {entry.name!r}")
        cursor = entry.start + entry.nbytes
        previous = repr(entry.name)
    if cursor != file_size:
        raise _fail(path, f"{file_size - cursor} bytes after the last tensor are not covered by any entry")
    return SafetensorsHeader(entries, {str(k): v for k, v in metadata.items()}, data_start)




def read_header(path: str) -> tuple[SafetensorsHeader, int]:
    """Read and validate the header of one safetensors file.

    Args:
        path: The .safetensors file.

    Returns:
        The header and the file size.
    """
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        prefix = handle.read(HEADER_LENGTH_BYTES)
        if len(prefix) == HEADER_LENGTH_BYTES:
            (length,) = struct.unpack("<Q", prefix)
            if length <= MAX_HEADER_BYTES and HEADER_LENGTH_BYTES + length <= file_size:
                prefix += handle.read(length)
    return parse_header(path, prefix, file_size), file_size


DATA_STORAGE = "data"
"""The storage key of a file's data section."""


def safetensors_records(
    header: SafetensorsHeader, data_key: str = DATA_STORAGE
) -> tuple[list[TensorRecord], dict[str, StorageRecord], StorageSpans]:
    """The data section as one storage, and each header entry as a contiguous view of it.

    Args:
        header: A validated header.
        data_key: The data section's storage key (a shard's name in a model directory).

    Returns:
        Tensor records, storages whose base address is the absolute file offset of
        their byte 0 (the data section, and any entry at an offset its element size
        does not divide), and where the file holds each storage.
    """
    data_size = sum(entry.nbytes for entry in header.entries)  # validated: no holes, no overlap
    tensors: list[TensorRecord] = []
    storages = {data_key: StorageRecord(data_key, "cpu", data_size, header.data_start)}
    spans = StorageSpans({data_key: header.data_start}, {data_key: data_size})
    strides: dict[tuple[int, ...], tuple[int, ...]] = {}
    itemsizes: dict[str, int] = {}
    for entry in header.entries:
        stride = strides.get(entry.shape)
        if stride is None:
            stride = strides[entry.shape] = _contiguous_stride(entry.shape)
        itemsize = itemsizes.get(entry.dtype)
        if itemsize is None:
            itemsize = itemsizes[entry.dtype] = dtype_info(entry.dtype).itemsize
        relative = entry.start - header.data_start
        key, offset = data_key, relative // itemsize
        if relative % itemsize:
            key, offset = f"{data_key}:{entry.name}", 0
            storages[key] = StorageRecord(key, "cpu", entry.nbytes, entry.start)
            spans.starts[key], spans.sizes[key] = entry.start, entry.nbytes
        tensors.append(TensorRecord(entry.name, TensorKind.TENSOR, entry.dtype, entry.shape, stride, key, offset))
    return tensors, storages, spans


def metadata_ties(header: SafetensorsHeader, present: set[str] | None = None) -> list[DeclaredTie]:
    """Names a file's `__metadata__` restores from a stored tensor, as declared ties.

    Args:
        header: A validated header.
        present: Every tensor name of the checkpoint (all shards); this file's names by default.

    Returns:
        One tie per restored name: `save_model`'s dropped -> kept names, and each
        `memlayout.aliases` entry that is the whole stored tensor (a tie, not a
        strided view of it). Keys that name a stored tensor, or values that do
        not, are other metadata (`{"format": "pt"}`) and are skipped.
    """
    stored = {entry.name: entry for entry in header.entries}
    names = present if present is not None else set(stored)
    ties: list[DeclaredTie] = []
    for key, value in header.metadata.items():
        if key != MEMLAYOUT_ALIASES_KEY and key not in names and value in names:
            ties.append(DeclaredTie(key, value, f"{METADATA_KEY} (safetensors save_model)"))
    aliases = _aliases(header.metadata.get(MEMLAYOUT_ALIASES_KEY))
    for alias, view in aliases.items():
        of = view.get("of")
        entry = stored.get(of) if isinstance(of, str) else None
        if (
            entry is not None
            and alias not in names
            and view.get("offset") == 0
            and view.get("dtype") == entry.dtype
            and view.get("shape") == list(entry.shape)
            and view.get("stride") == list(_contiguous_stride(entry.shape))
        ):
            ties.append(DeclaredTie(alias, entry.name, f"{METADATA_KEY} {MEMLAYOUT_ALIASES_KEY}"))
    return ties


def _aliases(text: str | None) -> dict[str, dict[str, Any]]:
    # The aliases are a hint for ties, never needed to read the file: a damaged
    # value is ignored rather than refused.
    if text is None:
        return {}
    import json  # only files that carry aliases

    try:
        aliases = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(aliases, dict):
        return {}
    return {str(k): v for k, v in aliases.items() if isinstance(v, dict)}


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride = []
    step = 1
    for dim in reversed(shape):
        stride.append(step)
        step *= max(dim, 1)
    return tuple(reversed(stride))


def load_safetensors(path: str) -> LoadedSource:
    """Read a safetensors file's header as layout records.

    Args:
        path: The .safetensors file.

    Returns:
        A `LoadedSource` with the data section as one storage and a reader over a memory map.

    Raises:
        CorruptCheckpointError: the header fails validation.
    """
    header, _ = read_header(path)
    tensors, storages, spans = safetensors_records(header)
    notes = []
    if header.metadata:
        shown = ", ".join(f"{k}={v[:40]}" for k, v in sorted(header.metadata.items())[:5])
        notes.append(f"safetensors __metadata__: {shown}")
    return file_source(
        path, "safetensors", tensors, storages, spans, declared_ties=metadata_ties(header), notes=notes
    )
