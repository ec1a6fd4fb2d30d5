"""The restricted unpickler for a stream that can only be read forward: a decompressor's output.

`memlayout.load.unpack` reads the pickles inside compressed streams and archives
as they go by. CPython's C unpickler cannot serve there: the memo check that keeps
it from allocating without bound (`memlayout.load.pickle_memo`) reads ahead and
seeks back. The pure-Python unpickler keeps its memo as a dict, and reads exactly
what each opcode needs; what it builds is the same inert tree as
`RestrictedUnpickler`'s, through the same `find_class` and `persistent_load`.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

from memlayout.load.array_pickles import SequentialReads
from memlayout.load.restricted_pickle import InertGlobals

_LARGE = 1 << 20
"""Strings and bytes past this length are stepped over by `StreamedUnpickler`: no global is named by them."""
_MAX_FRAME = 1 << 24
"""pickle writes frames of about 64 KiB; a frame this long is no pickle's, and would be read whole."""


class SkippedPayload(NamedTuple):
    """A long string or bytes object a streamed pickle carries, stepped over rather than read."""

    kind: str
    size: int


class StreamedUnpickler(InertGlobals, pickle._Unpickler):
    """The same, for a stream that can only be read forward (what a decompressor hands out).

    CPython's pure-Python unpickler: it keeps its memo as a dict, so no index can make
    it allocate, and the memo check (which reads ahead and seeks back) is not needed.
    It reads exactly what each opcode needs, as joblib's own unpickler (a subclass of
    it) relies on to find each array's bytes after the wrapper's BUILD. Memory stays
    bounded: a long string or bytes object is stepped over (`SkippedPayload`), a frame
    longer than pickle writes is refused, and the opcodes read to build objects are
    capped by the stream (`SequentialReads.limit`).
    """

    checks_memo = False
    # What pickle._Unpickler sets up in load() and defines for its opcodes; typeshed declares none of them.
    _unframer: Any
    read: Callable[[int], bytes]
    append: Callable[[Any], None]
    _decode_string: Callable[[bytes], Any]
    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)

    def __init__(self, stream: SequentialReads, storage_records: bool = False, encoding: str = "ASCII") -> None:
        super().__init__(stream, encoding=encoding)
        self._begin(stream, storage_records)

    def _payload(self, size: int, kind: str) -> bytes | SkippedPayload:
        if size <= _LARGE or self._unframer.current_frame:  # a frame is in memory already, and short
            data: bytes = self.read(size)
            if len(data) < size:
                raise pickle.UnpicklingError(f"the stream ends inside a {kind} of {size:,} bytes")
            return data
        if self.stream.skip(size) < size:
            raise pickle.UnpicklingError(f"the stream ends inside a {kind} of {size:,} bytes")
        return SkippedPayload(kind, size)

    def _sized(self, layout: str, kind: str, text: bool) -> None:
        (size,) = struct.unpack(layout, self.read(struct.calcsize(layout)))
        if size < 0:
            raise pickle.UnpicklingError(f"a {kind} of negative length")
        data = self._payload(size, kind)
        if text and isinstance(data, bytes):
            self.append(str(data, "utf-8", "surrogatepass") if kind != "string" else self._decode_string(data))
        else:
            self.append(bytearray(data) if kind == "bytearray" and isinstance(data, bytes) else data)

    def _load_frame(self) -> None:
        (size,) = struct.unpack("<Q", self.read(8))
        if size > _MAX_FRAME:
            raise pickle.UnpicklingError(f"a frame of {size:,} bytes, which no pickle writer makes")
        self._unframer.load_frame(size)

    dispatch[pickle.BINBYTES[0]] = lambda self: self._sized("<I", "bytes", False)
    dispatch[pickle.BINBYTES8[0]] = lambda self: self._sized("<Q", "bytes", False)
    dispatch[pickle.BYTEARRAY8[0]] = lambda self: self._sized("<Q", "bytearray", False)
    dispatch[pickle.BINUNICODE[0]] = lambda self: self._sized("<I", "text", True)
    dispatch[pickle.BINUNICODE8[0]] = lambda self: self._sized("<Q", "text", True)
    dispatch[pickle.BINSTRING[0]] = lambda self: self._sized("<i", "string", True)
    dispatch[pickle.FRAME[0]] = _load_frame
