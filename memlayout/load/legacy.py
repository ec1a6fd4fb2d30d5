"""Legacy (non-zip) torch.save files, and bare pickles, read without executing them.

Before torch 1.6, and with `_use_new_zipfile_serialization=False` since, torch.save
writes five things back to back: a pickled magic number, a pickled protocol
version, a pickled dict of system info (byte order, type sizes), the main pickle
(storages as persistent ids `('storage', type, key, location, numel, view)`,
module classes as `('module', class, file, source)`), and a pickled sorted list of
storage keys. Then, for each key in that order, an 8-byte element count and the
storage's raw bytes. Every pickle goes through the restricted unpickler; storage
bytes are located by walking the counts, so a reader can serve them in place.
Each pickle is written with the `pickle_protocol` torch.save was given: the
magic number is recognized by its value, in any protocol. torch.load reads
protocols 1 to 5 back; protocol 0 writes persistent ids as text, which torch.load
refuses ("saved_id must be a tuple"), and so does memlayout.

Any other file that `pickle.load` would read is a bare pickle (`pickle.dump` of a
model or dict, or a payload): torch.load(weights_only=False) unpickles it before
it checks the magic number. It is read the same way, metadata only, and ML601
names what loading it would import.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterable
from typing import Any, BinaryIO

from memlayout.errors import CorruptCheckpointError, DamagedPickleError
from memlayout.format_bytes import counted, human_bytes
from memlayout.load.array_pickles import ARRAY_GLOBALS, ExactReads, WrappedArray
from memlayout.load.detect import has_proto_signature, opens_like_a_pickle
from memlayout.load.file_source import StorageSpans, pickled_source
from memlayout.load.pickled_objects import PickledStorage
from memlayout.load.records import LoadedSource, PickleGlobal
from memlayout.load.restricted_pickle import (
    RestrictedUnpickler,
    TextPersistentIdError,
    read_first_pickle,
    run_unpickler,
    unpickle,
)

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
_COUNT = struct.Struct("<q")
def is_legacy_torch(path: str, head: bytes) -> bool:
    """Whether the bytes open a legacy torch.save file: a pickled magic number first.

    torch's legacy writer pickles the magic number with the protocol it was given
    (`pickle_protocol`, 2 by default), so the signature is the number, not its
    bytes: `L119547037146038801333356L` in protocols 0 and 1, a LONG1 from 2 on,
    inside a frame from 4 on. Every spelling is under 30 bytes.

    Args:
        path: The file (unused: the first bytes tell; every format check takes both).
        head: The file's first bytes.

    Returns:
        True when the first pickle in them unpickles to the magic number.
    """
    if not opens_like_a_pickle(path, head):
        return False
    try:
        magic = unpickle(head, storage_records=False, what="the first pickle").root
    except CorruptCheckpointError:
        return False
    return type(magic) is int and magic == MAGIC_NUMBER


def _names_a_module(found: PickleGlobal) -> bool:
    # What `import` could resolve: a pickle names a dotted module and an attribute.
    # Text that happens to open with GLOBAL's `c` names none.
    return all(part.isidentifier() for part in (*found.module.split("."), *found.name.split(".")))


def is_pickle(path: str, head: bytes) -> bool:
    """Whether torch.load would unpickle the file: a bare pickle (or a damaged one).

    A stream that opens with PROTO is a pickle by its signature, damaged or not.
    Any other opcode stream is one when the restricted unpickler reads a whole
    pickle from it, or resolves a global before the stream breaks: `pickle.load`
    would already have imported that global by then.

    Args:
        path: The file.
        head: Its first bytes.

    Returns:
        True when the file is read as format "pickle".
    """
    if has_proto_signature(head):
        return True
    if not opens_like_a_pickle(path, head):
        return False
    first = read_first_pickle(path)
    return first.complete or any(_names_a_module(found) for found in first.referenced)


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
        raise CorruptCheckpointError(f"{path} was saved on a big-endian machine",
                                     "re-save it on a little-endian machine")


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
        try:
            root, main = _load(path, handle, "main", True)
        except CorruptCheckpointError as exc:
            if isinstance(exc.__cause__, TextPersistentIdError):
                raise CorruptCheckpointError(
                    exc.message, "torch.load cannot read this file either; re-save the original object with "
                    "torch.save's default pickle protocol"
                ) from exc
            raise
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

    A joblib file is one too: `joblib.dump` writes each numpy array's bytes between
    the pickle's opcodes, which the unpickler steps over as `joblib.load` reads them
    (`memlayout.load.array_pickles`). The globals numpy and joblib rebuild arrays
    with count as allowed: they build an array and call nothing the file names.

    Args:
        path: The file.

    Returns:
        A `LoadedSource` of whatever tensors the placeholders reveal, without data;
        none for plain data, which its notes describe.

    Raises:
        CorruptCheckpointError: the pickle breaks off or is malformed; the message
            names the globals outside the allow-list that `pickle.load` would have
            imported before it failed.
    """
    with open(path, "rb") as handle:
        unpickler = RestrictedUnpickler(ExactReads(handle), False)
        try:
            root = run_unpickler(unpickler, f"{path}: the main pickle")
        except CorruptCheckpointError as exc:
            raise _damaged(exc, unpickler) from exc.__cause__
        referenced = [_array_globals_allowed(found) for found in _later_pickles_globals(path, handle, unpickler)]
    notes = [NOT_A_CHECKPOINT]
    if unpickler.arrays:
        notes.append(_joblib_arrays_note(unpickler.arrays))
    source = pickled_source(path, "pickle", root, None, pickle_globals=referenced, notes=notes)
    if not source.tensors:
        # Plain data (a dict of numbers, a fitted scaler's arrays): no tensor to lay out.
        # Still a report, as a folder's audit needs one per pickle: cleared when it
        # imports nothing outside the allow-list, ML601 when it does.
        cleared = all(found.allowed for found in referenced)
        source.notes = [
            f"a pickle of {_plain_value(root)} with no tensors, not a checkpoint"
            + ("; it imports nothing outside the allow-list" if cleared else ""),
            *notes[1:],
        ]
    source.content_unreadable = "a bare pickle locates no tensor bytes that can be read without unpickling it"
    return source


def _array_globals_allowed(found: PickleGlobal) -> PickleGlobal:
    if not found.allowed and (found.module, found.name) in ARRAY_GLOBALS:
        return found._replace(allowed=True)
    return found


def _joblib_arrays_note(arrays: list[WrappedArray]) -> str:
    raw = [array for array in arrays if array.nbytes or not array.dtype.startswith("O")]
    objects = len(arrays) - len(raw)
    note = (
        f"joblib: {counted(len(arrays), 'numpy array')} written between the pickle's opcodes "
        f"({human_bytes(sum(array.nbytes for array in raw))} of raw elements)"
    )
    if objects:
        note += f"; {counted(objects, 'array')} of Python objects, each a nested pickle joblib.load unpickles"
    return note


NOT_A_CHECKPOINT = "not a checkpoint: a bare pickle, not a torch.save file; tensor data is not located"


def _plain_value(root: Any) -> str:
    """What a pickle without tensors holds, in a few words: "a dict of 2 items"."""
    kind = type(root).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if isinstance(root, dict | list | tuple | set | frozenset):
        return f"{article} {kind} of {counted(len(root), 'item')}"
    return "None" if root is None else f"{article} {kind}"


def _damaged(exc: CorruptCheckpointError, unpickler: RestrictedUnpickler) -> CorruptCheckpointError:
    # pickle.load imports each global, and REDUCE calls it, as it reads: what came
    # before the damage has already run when torch.load fails on it.
    refused = sorted(f"{g.module}.{g.name}" for g in unpickler.referenced.values() if not g.allowed)
    if not refused:
        return exc
    shown = ", ".join(refused[:12]) + (f" and {len(refused) - 12} more" if len(refused) > 12 else "")
    return DamagedPickleError(
        f"{exc.message}; before that point it names {shown}, which torch.load(weights_only=False) "
        "would import and may call before it failed",
        "never load it with weights_only=False; if you expected a checkpoint, re-export it from its source",
        named=tuple((g.module, g.name) for g in unpickler.referenced.values() if not g.allowed),
    )
