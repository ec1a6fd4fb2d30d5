"""torch.distributed.checkpoint directories: `.metadata` plus `*.distcp` files.

`.metadata` is a plain pickle of `torch.distributed.checkpoint.metadata.Metadata`,
and `FileSystemReader.read_metadata` loads it with `pickle.load`, so it can run
code. Here it goes through the restricted unpickler: the dataclasses become
placeholders whose pickled state gives, per tensor, the dtype, the global shape and
the chunks (offsets and sizes of each shard), and where each chunk's bytes lie.

Metadata only: each tensor gets one storage of its global size with
`has_data=False` (chunks are serialized tensors inside the .distcp files, not raw
ranges), and the device is unknown because DCP does not record it. Two names
whose chunks are read from the same bytes share that storage, as a tie stored
once; each chunk is a `ChunkRecord`, where it sits in its tensor and in its file,
which ML106 reads for chunks that cover the same elements twice.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from memlayout.dtypes import dtype_info
from memlayout.errors import CorruptCheckpointError
from memlayout.format_bytes import counted
from memlayout.load.detect import DCP_DATA_SUFFIX, DCP_METADATA_FILE
from memlayout.load.pickled_objects import InertObject
from memlayout.load.records import (
    ChunkRecord,
    LoadedSource,
    PickleGlobal,
    StorageRecord,
    TensorKind,
    TensorRecord,
)
from memlayout.load.restricted_pickle import unpickle

METADATA_FILE = DCP_METADATA_FILE
DATA_SUFFIX = DCP_DATA_SUFFIX
UNKNOWN_DEVICE = "unknown"
_NOTE_LIMIT = 10
# What a genuine .metadata pickle references: DCP's own dataclasses and the paths
# it stores. They are what dcp.load imports anyway; anything else is reported.
_EXPECTED_PREFIX = "torch.distributed.checkpoint."


LAYOUT_UNRECORDED = (
    "torch.distributed.checkpoint metadata records no strides, storage offsets, devices or addresses: dcp.load "
    "reads each chunk with torch.load into fresh memory and copies it into the caller's own tensors, whose "
    "layout and alignment are the caller's"
)
"""Why the rules that read layout cannot run on DCP; those that read chunks and shared bytes do."""


class DcpChunk(NamedTuple):
    """One shard of a tensor: where it sits in the global tensor, and where its bytes lie."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    stored: tuple[str, int, int] | None = None
    """(file, byte offset, byte length) `.metadata`'s storage_data gives the chunk; None when it names none."""


class DcpTensor(NamedTuple):
    """A tensor as `.metadata` describes it (NamedTuples: a checkpoint holds 100,000)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]


def _state(obj: Any) -> dict[str, Any]:
    return obj.state_dict if isinstance(obj, InertObject) else {}


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if type(value) is tuple and all(type(v) is int and v >= 0 for v in value):
        return value  # the usual torch.Size, already a tuple: kept as it is, not copied
    if isinstance(value, InertObject):  # a torch.Size that was not resolved
        value = value.args[0] if value.args else ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise CorruptCheckpointError(f"DCP metadata has {what} {value!r:.80}; expected non-negative ints")
    return tuple(value)


def _dtype(properties: Any) -> str:
    # TensorProperties pickles its fields as a tuple: (dtype, layout, requires_grad,
    # memory_format, pin_memory); older versions pickle a dict with "dtype".
    state = properties.state if isinstance(properties, InertObject) else None
    if isinstance(state, tuple) and state and isinstance(state[0], str):
        return state[0]
    if isinstance(state, dict) and isinstance(state.get("dtype"), str):
        return str(state["dtype"])
    return "uint8"


def _stored_chunks(root: Any) -> dict[tuple[str, Any], tuple[str, int, int]]:
    """(fqn, index hint) and (fqn, offsets) -> (file, byte offset, byte length), from storage_data.

    dcp.save keys each chunk's bytes by MetadataIndex(fqn, offset, index), the index
    being the chunk's place in the tensor's list; the offsets find it where the hint is missing.
    """
    found: dict[tuple[str, Any], tuple[str, int, int]] = {}
    storage_data = _state(root).get("storage_data")
    for key, info in storage_data.items() if isinstance(storage_data, dict) else ():
        index, where = _state(key), _state(info)
        relative, offset, length = where.get("relative_path"), where.get("offset"), where.get("length")
        if not isinstance(relative, str) or type(offset) is not int or type(length) is not int:
            continue
        fqn = str(index.get("fqn"))
        found[(fqn, index.get("index"))] = found[(fqn, index.get("offset"))] = (relative, offset, length)
    return found


def dcp_tensors(root: Any) -> list[DcpTensor]:
    """The tensors a `.metadata` object tree describes.

    Args:
        root: The restricted unpickler's result for `.metadata`.

    Returns:
        One `DcpTensor` per tensor entry; bytes entries (pickled non-tensors) are skipped.
    """
    entries = _state(root).get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise CorruptCheckpointError("DCP .metadata has no state_dict_metadata: it is not a DCP checkpoint")
    stored = _stored_chunks(root)
    tensors = []
    # Once per tensor of checkpoints of 100,000 tensor shards: a straight loop.
    for name, entry in entries.items():
        if not isinstance(entry, InertObject) or type(entry).class_name != "TensorStorageMetadata":
            continue
        state = entry.state_dict
        shape = _ints(state.get("size"), f"size of {name}")
        chunks = []
        for index, chunk in enumerate(state.get("chunks") or ()):
            chunk_state = _state(chunk)
            offsets = _ints(chunk_state.get("offsets"), f"chunk offsets of {name}")
            where = stored.get((name, index)) or stored.get((name, offsets))
            chunks.append(DcpChunk(offsets, _ints(chunk_state.get("sizes"), f"chunk sizes of {name}"), where))
        tensors.append(DcpTensor(str(name), _dtype(state.get("properties")), shape, tuple(chunks)))
    return tensors


def _storage_files(root: Any) -> dict[str, int]:
    """relative path -> bytes the metadata expects it to hold at least."""
    needed: dict[str, int] = {}
    storage_data = _state(root).get("storage_data")
    for info in (storage_data or {}).values() if isinstance(storage_data, dict) else []:
        state = _state(info)
        relative = state.get("relative_path")
        if isinstance(relative, str):
            end = int(state.get("offset") or 0) + int(state.get("length") or 0)
            if end > needed.get(relative, -1):
                needed[relative] = end
    return needed


def _check_files(path: str, needed: dict[str, int]) -> None:
    for relative, end in sorted(needed.items()):
        if os.path.isabs(relative) or ".." in relative.replace("\\", "/").split("/"):
            raise CorruptCheckpointError(f"{path}: .metadata names data file {relative!r} outside the directory")
        full = os.path.join(path, relative)
        if not os.path.isfile(full):
            raise CorruptCheckpointError(
                f"{path}: .metadata names {relative}, which is missing",
                "copy every .distcp file of the checkpoint into the directory",
            )
        if os.path.getsize(full) < end:
            raise CorruptCheckpointError(f"{path}: {relative} is shorter than the {end} bytes .metadata expects")


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _chunk_notes(tensors: list[DcpTensor], files: int) -> list[str]:
    chunk_count = sum(len(t.chunks) for t in tensors)
    notes = [
        f"torch.distributed.checkpoint: {counted(len(tensors), 'tensor')} in {counted(chunk_count, 'chunk')} over "
        f"{counted(files, 'file')}; metadata only, so content checks are skipped; dcp.load reads .metadata with plain "
        "pickle.load"
    ]
    sharded = [t for t in tensors if len(t.chunks) > 1]
    for tensor in sharded[:_NOTE_LIMIT]:
        spans = " ".join(
            "[" + ",".join(f"{o}:{o + s}" for o, s in zip(c.offsets, c.sizes, strict=False)) + "]"
            for c in tensor.chunks
        )
        notes.append(f"{tensor.name} {list(tensor.shape)} is sharded in {len(tensor.chunks)} chunks: {spans}")
    if len(sharded) > _NOTE_LIMIT:
        notes.append(f"... and {len(sharded) - _NOTE_LIMIT} more sharded tensors")
    for tensor in tensors:
        covered = sum(_numel(c.sizes) for c in tensor.chunks)
        if covered != _numel(tensor.shape):
            notes.append(f"{tensor.name}: its chunks hold {covered} of {_numel(tensor.shape)} elements")
    return notes


def _unexpected_globals(globals_: list[PickleGlobal]) -> list[PickleGlobal]:
    return [
        g for g in globals_
        if not g.allowed and not (g.module.startswith(_EXPECTED_PREFIX) or g.module == "pathlib")
    ]


def load_dcp(path: str) -> LoadedSource:
    """Read a torch.distributed.checkpoint directory's metadata, executing nothing.

    Args:
        path: The checkpoint directory.

    Returns:
        A metadata-only `LoadedSource`: global shapes and dtypes, chunk layout in notes.

    Raises:
        CorruptCheckpointError: `.metadata` is missing or damaged, or names missing files.
    """
    metadata_path = os.path.join(path, METADATA_FILE)
    if not os.path.isfile(metadata_path):
        raise CorruptCheckpointError(
            f"{path} holds .distcp files but no {METADATA_FILE}",
            "the save did not finish or the file was not copied; DCP writes .metadata last, on rank 0",
        )
    with open(metadata_path, "rb") as handle:
        data = handle.read()
    result = unpickle(data, storage_records=False, what=metadata_path)
    del data
    pickle_globals = _unexpected_globals(result.globals)
    # What is needed of the object tree is taken out, and the tree let go, before
    # any record is built: for 100,000 tensors it holds half a million placeholders.
    tensors = dcp_tensors(result.root)
    needed = _storage_files(result.root)
    del result
    _check_files(path, needed)
    unread = [
        name for name in sorted(os.listdir(path))
        if name.endswith(DATA_SUFFIX) and name not in needed and os.path.getsize(os.path.join(path, name))
    ]
    records: list[TensorRecord] = []
    storages: dict[str, StorageRecord] = {}
    strides: dict[tuple[int, ...], tuple[int, ...]] = {}
    itemsizes: dict[str, int] = {}
    # Names whose every chunk is read from the same bytes of the same file are one
    # storage: a tie the checkpoint stores once. dcp.save itself writes each name's
    # chunks on their own, a tied model's two names included.
    by_bytes: dict[tuple[object, ...], str] = {}
    chunks: list[ChunkRecord] = []
    plain = TensorKind.TENSOR
    for tensor in tensors:
        name, dtype, shape = tensor.name, tensor.dtype, tensor.shape
        stride = strides.get(shape)
        if stride is None:
            # Contiguous strides, computed once per distinct shape.
            steps = []
            step = 1
            for dim in reversed(shape):
                steps.append(step)
                step *= max(dim, 1)
            stride = strides[shape] = tuple(reversed(steps))
        itemsize = itemsizes.get(dtype)
        if itemsize is None:
            itemsize = itemsizes[dtype] = dtype_info(dtype).itemsize
        key = name
        stored = tuple(chunk.stored for chunk in tensor.chunks)
        if stored and None not in stored:
            key = by_bytes.setdefault((dtype, shape, stored), name)
        records.append(TensorRecord(name, plain, dtype, shape, stride, key, 0))
        if key == name:
            storages[name] = StorageRecord(name, UNKNOWN_DEVICE, _numel(shape) * itemsize, None, False)
        for chunk in tensor.chunks:
            file, start, length = chunk.stored or ("", -1, -1)
            chunks.append(ChunkRecord(name, chunk.offsets, chunk.sizes, file, start, length))
    return LoadedSource(
        path=path,
        format="dcp",
        tensors=records,
        storages=storages,
        pickle_globals=pickle_globals,
        notes=_chunk_notes(tensors, len(needed)) + (
            [f"{', '.join(unread)}: not named by .metadata, so dcp.load never reads "
             f"{'it' if len(unread) == 1 else 'them'}"]
            if unread else []
        ),
        layout_unrecorded=LAYOUT_UNRECORDED,
        chunks=chunks,
        content_unreadable="torch.distributed.checkpoint is read as metadata only",
        # Every .distcp file is the checkpoint's, named in .metadata or left by an earlier save.
        files=(METADATA_FILE, *sorted({*needed, *unread, *(n for n in os.listdir(path) if n.endswith(DATA_SUFFIX))})),
    )
