"""numpy arrays inside pickles: joblib's array wrapper, and the globals numpy rebuilds arrays with.

`joblib.dump` pickles each numpy array as a `joblib.numpy_pickle.NumpyArrayWrapper`
(shape, order, dtype) and writes the array's bytes right after the wrapper's BUILD,
outside the pickle's opcodes: one byte giving the padding's length and the padding
(joblib 1.2 and later start each array on a 16-byte boundary), then the raw
elements. An array of Python objects is a nested pickle there instead, which
`joblib.load` unpickles with the same `find_class`, importing and calling whatever
it names. `pickle.load` cannot read such a file: it stops at the first raw byte.
joblib's own unpickler reads the bytes in its BUILD handler; here the wrapper's
placeholder does the same in `__setstate__`: it skips a numeric array's bytes, and
runs an object array's nested pickle through the restricted unpickler, whose
globals join the outer pickle's.

That needs the unpickler to have read exactly up to BUILD, which CPython's does on
a stream without `peek` (`ExactReads`): it then reads opcode by opcode, or frame by
frame, never ahead, and joblib ends a frame after each wrapper, as its own reader
needs.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any, NamedTuple, Protocol

from memlayout.errors import CorruptCheckpointError, UnpackLimitError
from memlayout.load.pickle_memo import check_stream_memo_indices
from memlayout.load.pickled_objects import InertObject

JOBLIB_ARRAY_WRAPPER = ("joblib.numpy_pickle", "NumpyArrayWrapper")

ARRAY_GLOBALS = frozenset(
    [
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        JOBLIB_ARRAY_WRAPPER,
    ]
)
"""The globals numpy and joblib rebuild an array with: they import numpy or joblib and build
an array from a dtype, a shape and bytes, calling nothing the file names. picklescan counts
numpy's as safe too. An array of objects brings the objects' own globals besides, judged alone."""

_NPY_ITEM_REFCOUNT = 0x01
"""numpy's dtype flag for items that hold Python objects (NPY_ITEM_REFCOUNT)."""
_TYPE_CODE = re.compile(r"[a-zA-Z](\d+)")


class ExactReads:
    """A binary file's reads, without `peek`: CPython's unpickler then never reads past the opcode it is at."""

    __slots__ = ("read", "readinto", "readline", "seek", "tell")

    def __init__(self, handle: io.BufferedReader) -> None:
        self.read = handle.read
        self.readinto = handle.readinto
        self.readline = handle.readline
        self.seek = handle.seek
        self.tell = handle.tell


class SequentialReads:
    """A stream that can only be read forward (a decompressor's output), read exactly as `ExactReads` is.

    `skip` steps over an array's bytes (or a long string's) by reading and dropping
    them, a megabyte at a time, so what a pickle only carries costs no memory. What
    the unpickler reads to build objects is counted against `limit`: a few kilobytes
    of bz2 can decompress to billions of APPENDs, each an object in memory.
    """

    __slots__ = ("_read", "_readinto", "_readline", "limit", "opcodes", "what")

    def __init__(self, stream: Any, limit: int = 1 << 62, what: str = "the stream") -> None:
        self._read = stream.read
        self._readinto = stream.readinto
        self._readline = stream.readline
        self.limit = limit
        """Bytes the unpickler may read to build objects (skipped payloads aside)."""
        self.opcodes = 0
        self.what = what

    def _count(self, count: int) -> None:
        self.opcodes += count
        if self.opcodes > self.limit:
            raise UnpackLimitError(
                f"{self.what}: its pickle is more than {self.limit >> 20} MiB of opcodes, memlayout's cap on what it "
                "builds from a decompressed stream (a few kilobytes of bz2 can hold billions of list appends)"
            )

    def read(self, count: int = -1) -> bytes:
        data: bytes = self._read(count)
        self._count(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        count: int = self._readinto(buffer)
        self._count(count)
        return count

    def readline(self) -> bytes:
        data: bytes = self._readline()
        self._count(len(data))
        return data

    def skip(self, count: int) -> int:
        """Read and drop `count` bytes; returns how many there were (fewer at the stream's end)."""
        left = count
        while left > 0:
            got = len(self._read(min(left, _SKIP_CHUNK)))
            if got == 0:
                break
            left -= got
        return count - left


_SKIP_CHUNK = 1 << 20


class ArrayReader(Protocol):
    """What the wrapper's placeholder needs of the unpickler reading a joblib file."""

    stream: Any
    """The `ExactReads` stream, at the byte after the wrapper's BUILD."""
    start: int
    """Where the pickle started in the stream."""
    arrays: list[WrappedArray]
    """The arrays stepped over so far."""

    def read_nested_pickle(self, what: str) -> None:
        """Read one pickle from the stream's position, its globals joining this unpickler's."""
        ...


class WrappedArray(NamedTuple):
    """One array joblib wrote between the pickle's opcodes."""

    shape: tuple[int, ...]
    dtype: str
    """numpy's type code, e.g. "f8", "O8"."""
    nbytes: int
    """Bytes of raw elements; 0 for an array of objects (a nested pickle)."""
    padding: int = 0
    """Bytes before the elements: the padding's length byte and the padding."""


def _dtype_layout(dtype: Any) -> tuple[str, int, bool]:
    """(type code, itemsize, holds objects) of a pickled `numpy.dtype`, computed without numpy.

    numpy pickles a dtype as REDUCE `numpy.dtype(code, align, copy)` and BUILD with
    (version, byte order, subarray, names, fields, elsize, alignment, flags, ...):
    elsize is -1 for the fixed-size types, whose code holds the size ("f8").
    """
    if not isinstance(dtype, InertObject) or not dtype.args or not isinstance(dtype.args[0], str):
        raise CorruptCheckpointError(f"joblib's array wrapper has dtype {dtype!r:.80}, not a pickled numpy.dtype")
    code = dtype.args[0]
    state = dtype.state if isinstance(dtype.state, tuple) else ()
    elsize = state[5] if len(state) > 5 and type(state[5]) is int and state[5] > 0 else None
    if elsize is None:
        sized = _TYPE_CODE.fullmatch(code)
        if sized is None:
            raise CorruptCheckpointError(f"joblib's array wrapper has dtype code {code!r:.40}, which sets no size")
        elsize = int(sized.group(1))
    flags = state[7] if len(state) > 7 and type(state[7]) is int else 0
    return code, elsize, code.startswith("O") or bool(flags & _NPY_ITEM_REFCOUNT)


def _element_count(shape: Any) -> tuple[tuple[int, ...], int]:
    if not isinstance(shape, tuple) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise CorruptCheckpointError(f"joblib's array wrapper has shape {shape!r:.80}")
    count = 1
    for dim in shape:
        count *= dim
    return shape, count


def skip_wrapped_array(unpickler: ArrayReader, state: Any) -> WrappedArray:
    """Step the unpickler's stream over the array joblib wrote after a wrapper's BUILD, as joblib.load reads it.

    Args:
        unpickler: The unpickler, reading an `ExactReads` stream.
        state: The wrapper's pickled state (its `__dict__`).

    Returns:
        What the array is.

    Raises:
        CorruptCheckpointError: the state is not joblib's, or the file ends inside the array.
    """
    if not isinstance(state, dict):
        raise CorruptCheckpointError(f"joblib's array wrapper has state {state!r:.80}")
    stream = unpickler.stream
    code, itemsize, holds_objects = _dtype_layout(state.get("dtype"))
    shape, count = _element_count(state.get("shape"))
    if holds_objects:
        # joblib.load reads it with its own unpickler, routing find_class through the outer one.
        unpickler.read_nested_pickle("the pickle of a joblib array of objects")
        # Its opcodes count as the outer pickle's: not skipped bytes.
        return WrappedArray(shape, code, 0)
    padding = 0
    nbytes = count * itemsize
    if state.get("numpy_array_alignment_bytes") is not None:
        length = stream.read(1)
        if len(length) != 1:
            raise CorruptCheckpointError("the file ends before a joblib array's padding")
        padding = 1 + length[0]
        if isinstance(stream, SequentialReads):
            stream.skip(length[0])
        else:
            stream.seek(length[0], os.SEEK_CUR)
    if isinstance(stream, SequentialReads):
        if stream.skip(nbytes) < nbytes:
            raise CorruptCheckpointError(f"the stream ends inside a joblib array of {nbytes:,} bytes")
        return WrappedArray(shape, code, nbytes, padding)
    start = stream.tell()
    end = stream.seek(0, os.SEEK_END)
    if start + nbytes > end:
        raise CorruptCheckpointError(f"the file ends inside a joblib array of {nbytes:,} bytes")
    stream.seek(start + nbytes)
    return WrappedArray(shape, code, nbytes, padding)


def _check_resumed_opcodes(unpickler: ArrayReader) -> None:
    # The memo check before loading stopped at the first array's bytes (its padding
    # length, 1 to 16, is no opcode); the opcodes after each array are checked here.
    skipped = sum(array.nbytes + array.padding for array in unpickler.arrays)
    check_stream_memo_indices(
        unpickler.stream, "a joblib pickle", opcodes_before=unpickler.stream.tell() - unpickler.start - skipped
    )


def joblib_wrapper_class(unpickler: ArrayReader) -> type[InertObject]:
    """The placeholder `joblib.numpy_pickle.NumpyArrayWrapper` becomes for one unpickler."""

    def __setstate__(self: InertObject, state: Any) -> None:
        self.state = state
        unpickler.arrays.append(skip_wrapped_array(unpickler, state))
        if not isinstance(unpickler.stream, SequentialReads):  # the pure-Python unpickler has no memo to guard
            _check_resumed_opcodes(unpickler)

    module, name = JOBLIB_ARRAY_WRAPPER
    return type(
        name,
        (InertObject,),
        {"class_module": module, "class_name": name, "__module__": __name__, "__slots__": (),
         "__setstate__": __setstate__},
    )
