"""Legacy (non-zip) torch.save files, and bare pickles, read without executing them.

Before torch 1.6, and with `_use_new_zipfile_serialization=False` since, torch.save
writes five things back to back: a pickled magic number, a pickled protocol
version, a pickled dict of system info (byte order, type sizes), the main pickle
(storages as persistent ids `('storage', type, key, location, numel, view)`,
module classes as `('module', class, file, source)`), and a pickled sorted list of
storage keys. Then, for each key in that order, an 8-byte element count and the
storage's raw bytes. Every pickle goes through the restricted unpickler; storage
bytes are located by walking the counts, so a reader can serve them in place.

A file that starts like a protocol-2+ pickle but lacks the magic number is a bare
pickle (`pickle.dump` of a model or dict): it is read the same way, metadata only.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterable
from typing import Any, BinaryIO

from memlayout.errors import CorruptCheckpointError
from memlayout.load.file_source import StorageSpans, pickled_source
from memlayout.load.records import LoadedSource, PickleGlobal
from memlayout.load.restricted_pickle import (
    PickledStorage,
    RestrictedUnpickler,
    run_unpickler,
)

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
# pickle.dump(MAGIC_NUMBER, protocol>=2): PROTO n, then LONG1 of 10 little-endian bytes.
_MAGIC_PICKLED = b"\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")
_COUNT = struct.Struct("<q")


def is_pickle(head: bytes) -> bool:
    """Whether the bytes open a protocol 2-5 pickle stream (legacy torch.save or bare pickle).

    Args:
        head: The file's first bytes.

    Returns:
        True when they start with the PROTO opcode and a known protocol.
    """
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def is_legacy_torch(head: bytes) -> bool:
    """Whether the bytes open a legacy torch.save file (pickled magic number first).

    Args:
        head: The file's first bytes.

    Returns:
        True for the legacy format's signature.
    """
    return is_pickle(head) and head[2 : 2 + len(_MAGIC_PICKLED)] == _MAGIC_PICKLED




def _load(path: str, handle: BinaryIO, what: str, storage_records: bool) -> tuple[Any, RestrictedUnpickler]:
    unpickler = RestrictedUnpickler(handle, storage_records)  # type: ignore[arg-type]
    return run_unpickler(unpickler, f"{path}: the {what} pickle"), unpickler


def _storage_spans(
    path: str, handle: BinaryIO, keys: list[str], storages: dict[str, PickledStorage], file_size: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Absolute start and byte size of each storage, walking the 8-byte counts."""
    starts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    position = handle.tell()
    for key in keys:
        handle.seek(position)
        raw = handle.read(_COUNT.size)
        if len(raw) < _COUNT.size:
            raise CorruptCheckpointError(f"{path}: the file ends before storage {key}")
        (count,) = _COUNT.unpack(raw)
        storage = storages.get(key)
        itemsize = storage.nbytes // storage.numel if storage is not None and storage.numel else 1
        nbytes = count * itemsize
        start = position + _COUNT.size
        if count < 0 or start + nbytes > file_size:
            raise CorruptCheckpointError(f"{path}: storage {key} ({nbytes} bytes) runs past the end of the file")
        starts[key], sizes[key] = start, nbytes
        position = start + nbytes
    return starts, sizes


def merge_globals(referenced: Iterable[dict[tuple[str, str], PickleGlobal]]) -> list[PickleGlobal]:
    """The globals several pickles of one file reference, each once (ML601 lists them)."""
    merged: dict[tuple[str, str], PickleGlobal] = {}
    for globals_of_one_pickle in referenced:
        merged.update(globals_of_one_pickle)
    return list(merged.values())


def refuse_big_endian(path: str, sys_info: Any) -> None:
    """Raise for a file whose pickled system info says it was saved big-endian.

    Storage bytes are read in place as little-endian; torch.load byte-swaps them.
    """
    if isinstance(sys_info, dict) and sys_info.get("little_endian") is False:
        raise CorruptCheckpointError(f"{path} was saved on a big-endian machine", "re-save it on a little-endian machine")


def load_legacy(path: str) -> LoadedSource:
    """Read a legacy torch.save file as metadata, executing nothing from it.

    Args:
        path: The file.

    Returns:
        A `LoadedSource` with `legacy_format=True` and a reader over a memory map.

    Raises:
        CorruptCheckpointError: a pickle is damaged or the storages are truncated.
    """
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        magic, first = _load(path, handle, "magic number", False)
        version, second = _load(path, handle, "protocol version", False)
        if magic != MAGIC_NUMBER or version != PROTOCOL_VERSION:
            raise CorruptCheckpointError(f"{path}: legacy torch.save header is invalid (protocol {version!r})")
        sys_info, third = _load(path, handle, "system info", False)
        refuse_big_endian(path, sys_info)
        root, main = _load(path, handle, "main", True)
        keys, fourth = _load(path, handle, "storage key list", False)
        if not isinstance(keys, list):
            raise CorruptCheckpointError(f"{path}: the storage key list is not a list")
        storages = main.storages
        starts, sizes = _storage_spans(path, handle, [str(k) for k in keys], storages, file_size)
    # torch.load cannot map a legacy file: it reads each storage into fresh memory.
    return pickled_source(
        path, "torch-legacy", root, StorageSpans(starts, sizes), used_in_place=False,
        pickle_globals=merge_globals(u.referenced for u in (first, second, third, main, fourth)),
        legacy_format=True,
    )


_MAX_LATER_PICKLES = 64


def _later_pickles_globals(path: str, handle: io.BufferedReader, first: RestrictedUnpickler) -> list[PickleGlobal]:
    # pickle.load reads one pickle, but a file can hold several, and a reader that
    # loads them in turn (as torch's legacy format does) runs every one: a clean
    # first pickle hiding a malicious second is picklescan's malicious6.pkl. The
    # globals of each later pickle are listed too; a tail that is no pickle ends it.
    referenced = dict(first.referenced)
    for _ in range(_MAX_LATER_PICKLES):
        if not handle.peek(1):
            break
        unpickler = RestrictedUnpickler(handle, False)
        try:
            run_unpickler(unpickler, f"{path}: a later pickle")
        except CorruptCheckpointError:
            referenced.update(unpickler.referenced)
            break
        referenced.update(unpickler.referenced)
    return list(referenced.values())


def load_bare_pickle(path: str) -> LoadedSource:
    """Read a plain pickle (not torch.save) as metadata, executing nothing from it.

    Args:
        path: The file.

    Returns:
        A `LoadedSource` of whatever tensors the placeholders reveal, without data.
    """
    with open(path, "rb") as handle:
        root, unpickler = _load(path, handle, "main", False)
        referenced = _later_pickles_globals(path, handle, unpickler)
    source = pickled_source(
        path, "pickle", root, None,
        pickle_globals=referenced,
        notes=["a bare pickle, not a torch.save file: tensor data is not located"],
    )
    source.content_unreadable = "a bare pickle locates no tensor bytes that can be read without unpickling it"
    return source
