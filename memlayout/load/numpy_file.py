"""numpy's `.npy` and `.npz` files: arrays of numbers are data, arrays of Python objects are pickles.

An `.npy` file is a magic string, a version, a header (a Python dict literal
giving the dtype, the shape and the order) and the array's bytes. An array of
numbers is its raw elements, which memlayout reports as a tensor with its bytes.
An array of Python objects (dtype `object`) is a pickle instead, written by
`pickle.dump`: `numpy.load` refuses it unless `allow_pickle=True`, and then
unpickles it with every import and call it names. Here it goes through the
restricted unpickler and ML601 names its globals. An `.npz` is a zip of `.npy`
members, as `numpy.savez` writes it (stored) or `numpy.savez_compressed` (deflated).

The header is read with `ast.literal_eval`, as numpy's own reader does, and its
dtype with numpy's `descr_to_dtype`; no array is built.
"""

from __future__ import annotations

import ast
import io
import os
import struct
from typing import Any, NamedTuple

from memlayout.dtypes import DTYPES
from memlayout.errors import CorruptCheckpointError, DamagedPickleError
from memlayout.format_bytes import counted
from memlayout.io.zip_archive import ZipReader
from memlayout.io.zip_archive.records import STORED
from memlayout.load.array_pickles import ARRAY_GLOBALS
from memlayout.load.detect import NPY_MAGIC
from memlayout.load.file_source import StorageSpans, file_source
from memlayout.load.records import (
    LoadedSource,
    PickleGlobal,
    StorageRecord,
    TensorKind,
    TensorRecord,
)
from memlayout.load.restricted_pickle import RestrictedUnpickler, run_unpickler

ARRAY_NAME = "array"
"""The tensor name of an `.npy` file's one array (an `.npz` names each by its member)."""
MAX_HEADER_BYTES = 10_000
"""numpy.load's own limit on a header's size (`max_header_size`); a longer one is refused there too."""
_HEADER_READ = 16 + MAX_HEADER_BYTES
_NPY_SUFFIX = ".npy"
_LOADER = "numpy.load"


class NpyHeader(NamedTuple):
    """What an `.npy` header says, and where the data starts."""

    data_start: int
    """Offset of the array's first byte (or of the pickle), from the file's or member's start."""
    dtype: Any
    """The numpy dtype."""
    shape: tuple[int, ...]
    fortran_order: bool


def parse_header(data: bytes, what: str) -> NpyHeader:
    """Parse the header at the start of `data`, as `numpy.lib.format` reads it.

    Args:
        data: The file's (or member's) first bytes, at least the whole header.
        what: The file as errors name it.

    Returns:
        The header.

    Raises:
        CorruptCheckpointError: no npy magic, an unknown version, or a header numpy refuses.
    """
    if not data.startswith(NPY_MAGIC):
        raise CorruptCheckpointError(f"{what} is not an .npy array: its magic string is missing")
    if len(data) < 12:
        raise CorruptCheckpointError(f"{what} ends inside its .npy header")
    major = data[6]
    if major == 1:
        (length,), start, encoding = struct.unpack_from("<H", data, 8), 10, "latin1"
    elif major in (2, 3):
        (length,), start, encoding = struct.unpack_from("<I", data, 8), 12, "latin1" if major == 2 else "utf8"
    else:
        raise CorruptCheckpointError(f"{what} is an .npy file of version {major}.{data[7]}, which numpy does not read")
    if length > MAX_HEADER_BYTES or start + length > len(data):
        raise CorruptCheckpointError(f"{what} has an .npy header of {length:,} bytes, more than numpy.load reads")
    try:
        header = ast.literal_eval(data[start : start + length].decode(encoding))
    except (SyntaxError, ValueError, UnicodeDecodeError, MemoryError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{what}: the .npy header is not a Python literal: {exc}") from exc
    if not isinstance(header, dict) or {"descr", "fortran_order", "shape"} - header.keys():
        raise CorruptCheckpointError(f"{what}: the .npy header lacks descr, fortran_order or shape")
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise CorruptCheckpointError(f"{what}: the .npy header's shape {shape!r:.80} is not a tuple of sizes")
    import numpy

    try:
        dtype = numpy.lib.format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"{what}: the .npy header's dtype {header['descr']!r:.80} is not one numpy "
                                     "reads") from exc
    return NpyHeader(start + length, dtype, shape, bool(header["fortran_order"]))


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _strides(shape: tuple[int, ...], fortran_order: bool) -> tuple[int, ...]:
    dims = list(reversed(shape)) if not fortran_order else list(shape)
    steps, step = [], 1
    for dim in dims:
        steps.append(step)
        step *= max(dim, 1)
    return tuple(reversed(steps)) if not fortran_order else tuple(steps)


def _torch_dtype(dtype: Any) -> str | None:
    # torch reads numpy's own names for the little-endian numeric types
    # (torch.from_numpy); anything else is laid out as its bytes.
    if dtype.kind in "biufc" and dtype.byteorder in "<=|" and dtype.name in DTYPES:
        return str(dtype.name)
    return None


class _Array(NamedTuple):
    name: str
    header: NpyHeader


def _array_records(
    arrays: list[_Array], starts: dict[str, int]
) -> tuple[list[TensorRecord], dict[str, StorageRecord], list[str]]:
    tensors: list[TensorRecord] = []
    storages: dict[str, StorageRecord] = {}
    notes: list[str] = []
    for name, header in arrays:
        nbytes = _numel(header.shape) * header.dtype.itemsize
        dtype = _torch_dtype(header.dtype)
        shape: tuple[int, ...] = (nbytes,)
        stride: tuple[int, ...] = (1,)
        if dtype is None:
            notes.append(f"{name}: numpy dtype {header.dtype.str} has no torch counterpart; its bytes are shown as "
                         "uint8")
        else:
            shape, stride = header.shape, _strides(header.shape, header.fortran_order)
        # numpy.load reads into fresh memory unless mmap_mode is given: no address in the file.
        storages[name] = StorageRecord(name, "cpu", nbytes, None, name in starts)
        tensors.append(TensorRecord(name, TensorKind.TENSOR, dtype or "uint8", shape, stride, name, 0))
    return tensors, storages, notes


def _objects_note(name: str, header: NpyHeader) -> str:
    return (
        f"{name} is an array of Python objects {list(header.shape)}: its elements are a pickle, which "
        f"{_LOADER} refuses unless allow_pickle=True, and then unpickles with every import it names; an array "
        "of numbers, strings and dicts names only numpy's, and re-saved with a numeric dtype it needs no pickle"
    )


def _unpickle_objects(data: Any, what: str) -> list[PickleGlobal]:
    unpickler = RestrictedUnpickler(data, storage_records=False)
    try:
        run_unpickler(unpickler, what)
    except CorruptCheckpointError as exc:
        named = sorted(f"{g.module}.{g.name}" for g in unpickler.referenced.values())
        if named:
            raise DamagedPickleError(
                f"{exc.message}; before that point it names {', '.join(named[:12])}, which {_LOADER}"
                "(allow_pickle=True) would import and may call before it failed",
                f"never load it with allow_pickle=True; {exc.hint}" if exc.hint
                else "never load it with allow_pickle=True",
                named=tuple((g.module, g.name) for g in unpickler.referenced.values()
                            if (g.module, g.name) not in ARRAY_GLOBALS),
            ) from exc
        raise
    # The globals numpy rebuilds arrays and scalars with build data and call nothing the file
    # names, as in a bare or joblib pickle: an array of numbers, strings and dicts names only
    # those, and what is left for ML601 is what else allow_pickle=True would import.
    return [
        found._replace(allowed=True) if (found.module, found.name) in ARRAY_GLOBALS else found
        for found in unpickler.referenced.values()
    ]


def load_npy(path: str) -> LoadedSource:
    """Read an `.npy` file: an array of numbers as one tensor with its bytes, an array of objects as a pickle.

    Args:
        path: The file.

    Returns:
        The source: one tensor named "array", or none and the pickle's globals.

    Raises:
        CorruptCheckpointError: a damaged header or pickle, or data shorter than the header says.
    """
    with open(path, "rb") as handle:
        header = parse_header(handle.read(_HEADER_READ), path)
        size = os.fstat(handle.fileno()).st_size
        if header.dtype.hasobject:
            handle.seek(header.data_start)
            globals_ = _unpickle_objects(handle, f"{path}: the array's pickle")
            return LoadedSource(
                path, "npy", [], {}, pickle_globals=globals_, notes=[_objects_note(ARRAY_NAME, header)],
                content_unreadable="an array of Python objects is a pickle, with no element bytes to read",
            )
    nbytes = _numel(header.shape) * header.dtype.itemsize
    if header.data_start + nbytes > size:
        raise CorruptCheckpointError(f"{path} holds {size - header.data_start:,} bytes of data; its header says "
                                     f"{nbytes:,}")
    tensors, storages, notes = _array_records([_Array(ARRAY_NAME, header)], {ARRAY_NAME: header.data_start})
    spans = StorageSpans({ARRAY_NAME: header.data_start}, {ARRAY_NAME: nbytes})
    return file_source(path, "npy", tensors, storages, spans, notes=["numpy array: data, no pickle", *notes])


def load_npz(path: str) -> LoadedSource:
    """Read an `.npz` file: each member as `load_npy` reads a file.

    Stored members (numpy.savez) keep their bytes where they lie; deflated ones
    (numpy.savez_compressed) are inflated only for their headers and pickles.

    Args:
        path: The file.

    Returns:
        The source: one tensor per array of numbers, named by its member without `.npy`.

    Raises:
        CorruptCheckpointError: a damaged zip, header or pickle.
    """
    arrays: list[_Array] = []
    starts: dict[str, int] = {}
    globals_: dict[tuple[str, str], PickleGlobal] = {}
    notes: list[str] = []
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        archive = ZipReader(fd, os.fstat(fd).st_size, what=path)
        for entry in archive.entries:
            name = entry.name.removesuffix(_NPY_SUFFIX)
            what = f"{path}: {entry.name}"
            if entry.method == STORED:
                begin = archive.data_start(entry)
                data = os.pread(fd, min(_HEADER_READ, entry.size), begin)
            else:
                begin, data = -1, archive.read(entry.name)
            header = parse_header(data, what)
            if header.dtype.hasobject:
                stream = io.BytesIO(data if begin < 0 else archive.read(entry.name))
                stream.seek(header.data_start)
                for found in _unpickle_objects(stream, f"{what}: the array's pickle"):
                    globals_.setdefault((found.module, found.name), found)
                notes.append(_objects_note(name, header))
                continue
            if header.data_start + _numel(header.shape) * header.dtype.itemsize > entry.size:
                raise CorruptCheckpointError(f"{what} holds less data than its header says")
            arrays.append(_Array(name, header))
            if begin >= 0:
                starts[name] = begin + header.data_start
    finally:
        os.close(fd)
    tensors, storages, dtype_notes = _array_records(arrays, starts)
    if len(starts) < len(arrays):
        notes.append(f"{counted(len(arrays) - len(starts), 'array')} deflated (numpy.savez_compressed): "
                     "their bytes are read only by inflating them")
    spans = StorageSpans(starts, {key: storages[key].nbytes for key in starts}) if starts else None
    source = file_source(path, "npz", tensors, storages, spans, pickle_globals=list(globals_.values()),
                         notes=[*notes, *dtype_notes])
    if spans is None:
        source.content_unreadable = "the arrays of a compressed .npz are read only by inflating them"
    return source
