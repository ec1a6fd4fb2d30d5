"""Compressed streams decompressed in bounded memory, against a cap on what one file may unpack to.

Each codec of `memlayout.load.detect.CODECS` becomes a forward-only stream whose
`read(n)` decompresses at most `n` bytes (every decompressor in the standard
library, and lz4's, takes a `max_length`), so a stream of any size is read a
megabyte at a time. Every decompressed byte is counted against the file's
`UnpackBudget`: past `MAX_UNPACKED_BYTES` the read stops with `UnpackLimitError`,
which is how a decompression bomb (a few kilobytes that inflate to terabytes)
ends: one error, nothing allocated beyond a chunk.

Several streams back to back (a gzip file of several members, pbzip2's bz2, an xz
of several streams) are read one after the other, as Python's gzip, bz2 and lzma
modules read them; bytes after the last stream that open no further stream are
ignored, as those modules ignore them.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO

from memlayout.errors import CorruptCheckpointError, UnpackLimitError
from memlayout.format_bytes import human_bytes

MAX_UNPACKED_BYTES = 8 << 30
"""What one file may unpack to, over every stream and member inside it: 8 GiB. A larger
file is refused unread, as a bomb would be; unpack it yourself where its size is expected."""
MAX_PICKLE_BYTES = 256 << 20
"""What a pickle read from a decompressed stream may spend in opcodes (long strings and bytes, and
joblib's arrays, stepped over aside): what builds objects in memory, which a few kilobytes of bz2
can make billions of. A genuine joblib or bare pickle's opcodes are a few megabytes at most."""
MAX_DEPTH = 4
"""How many containers deep a file is read (a tar.gz of a zip of a joblib.xz is 4)."""
MAX_MEMBERS = 100_000
"""How many members one file's archives may hold in all."""
CHUNK = 1 << 20
"""Bytes read from the compressed stream at a time."""
_JOBLIB_ZF_HEADER = 2 + 19
"""joblib's old "ZF" format: b"ZF", then the length as hex padded to 19 bytes, then zlib."""


class UnpackBudget:
    """What one file's unpacking has spent against the caps, shared by every layer and member of it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.unpacked = 0
        """Bytes decompressed or copied out of archives so far."""
        self.members = 0

    def spend(self, count: int) -> None:
        """Count `count` more unpacked bytes.

        Raises:
            UnpackLimitError: past `MAX_UNPACKED_BYTES`.
        """
        self.unpacked += count
        if self.unpacked > MAX_UNPACKED_BYTES:
            raise UnpackLimitError(
                f"{self.path} unpacks to more than {human_bytes(MAX_UNPACKED_BYTES)}, memlayout's cap on what one "
                "file may decompress to: a decompression bomb, or a file too large to audit unpacked"
            )

    def add_member(self) -> None:
        """Count one more archive member.

        Raises:
            UnpackLimitError: past `MAX_MEMBERS`.
        """
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise UnpackLimitError(f"{self.path} holds more than {MAX_MEMBERS:,} archive members, memlayout's cap")


class _ZlibStep:
    """zlib's decompressor with the interface of bz2's and lzma's (`needs_input`, `max_length`)."""

    def __init__(self, wbits: int) -> None:
        import zlib

        self._inflater = zlib.decompressobj(wbits)

    @property
    def eof(self) -> bool:
        return bool(self._inflater.eof)

    @property
    def unused_data(self) -> bytes:
        return bytes(self._inflater.unused_data)

    @property
    def needs_input(self) -> bool:
        return not self._inflater.unconsumed_tail

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return self._inflater.decompress(self._inflater.unconsumed_tail + data, max_length)


def new_decompressor(codec: str) -> Any:
    """A fresh decompressor for one stream of `codec`."""
    import zlib

    if codec in ("zlib", "joblib-zf"):
        return _ZlibStep(zlib.MAX_WBITS)
    if codec == "deflate":  # a zip member's raw deflate stream: no header
        return _ZlibStep(-zlib.MAX_WBITS)
    if codec == "gzip":
        return _ZlibStep(16 + zlib.MAX_WBITS)
    if codec == "bz2":
        import bz2

        return bz2.BZ2Decompressor()
    if codec in ("xz", "lzma"):
        import lzma

        return lzma.LZMADecompressor(lzma.FORMAT_XZ if codec == "xz" else lzma.FORMAT_ALONE)
    if codec == "lz4":
        import lz4.frame  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return lz4.frame.LZ4FrameDecompressor()
    raise AssertionError(f"no decompressor for {codec}")


def codec_errors() -> tuple[type[BaseException], ...]:
    """What a decompressor raises on damaged input."""
    import lzma
    import zlib

    errors: tuple[type[BaseException], ...] = (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError)
    try:
        import lz4.frame  # noqa: F401  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return errors
    return (*errors, RuntimeError)  # lz4's decompressor raises RuntimeError on damaged frames


WEAK_MAGIC = ("zlib", "lzma")
"""Codecs recognized by a header other bytes can have: confirmed by decompressing the first bytes."""


def opens_a_stream(codec: str, head: bytes) -> bool:
    """Whether `head` opens a stream of `codec`: a strong magic says so; a weak one is tried.

    Args:
        codec: What `detect.compression_of` said `head` is.
        head: The first bytes.

    Returns:
        False when decompressing the first bytes fails at once (text that opens with "x^" is no zlib).
    """
    if codec not in WEAK_MAGIC:
        return True
    try:
        new_decompressor(codec).decompress(head, 64)
    except codec_errors():
        return False
    return True


def readable(codec: str) -> str:
    """Why `codec` cannot be decompressed here, or "" when it can (lz4 and zstd need their packages)."""
    package = {"lz4": "lz4", "zstd": "zstandard"}.get(codec)
    if package is None:
        return ""
    import importlib.util

    if importlib.util.find_spec(package) is not None and codec != "zstd":
        return ""
    return f"a {codec} stream, which needs the {package} package to decompress" + (
        "" if codec != "zstd" else " (memlayout does not read it yet)"
    )


class DecompressedStream(io.RawIOBase):
    """The decompressed bytes of a compressed stream, read forward in bounded pieces.

    Args:
        codec: A `CODECS` name.
        source: The compressed bytes, read forward.
        budget: The file's budget, charged for every decompressed byte.
        where: The stream as errors name it ("model.joblib", "a.tar.gz: weights.pkl").
    """

    def __init__(self, codec: str, source: BinaryIO, budget: UnpackBudget, where: str) -> None:
        super().__init__()
        self._codec = codec
        self._source = source
        self._budget = budget
        self._where = where
        self._step = new_decompressor(codec)
        self._errors = codec_errors()
        self._done = False
        self._pending = b""
        if codec == "joblib-zf":
            source.read(_JOBLIB_ZF_HEADER)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _read(self, size: int) -> bytes:
        if self._pending:
            out, self._pending = self._pending[:size], self._pending[size:]
            return out
        while not self._done:
            try:
                if self._step.eof:
                    if not self._next_stream():
                        break
                    continue
                data = self._source.read(CHUNK) if self._step.needs_input else b""
                if not data and self._step.needs_input:
                    raise CorruptCheckpointError(
                        f"{self._where}: the {self._codec} stream ends before its end marker (the file is cut short)"
                    )
                out = self._step.decompress(data, size)
            except self._errors as exc:
                raise CorruptCheckpointError(f"{self._where}: the {self._codec} stream is damaged: {exc}") from exc
            if out:
                self._budget.spend(len(out))
                return bytes(out)
        return b""

    def _next_stream(self) -> bool:
        # Another stream may follow (gzip members, bz2 and xz streams); bytes that open
        # none end the stream, as gzip, bz2 and lzma ignore them.
        rest = self._step.unused_data or self._source.read(CHUNK)
        if not rest or self._codec in ("zlib", "joblib-zf", "lzma", "deflate"):
            self._done = True
            return False
        step = new_decompressor(self._codec)
        try:
            first = step.decompress(rest, 1)
        except self._errors:
            self._done = True
            return False
        self._step = step
        if first:
            self._budget.spend(len(first))
            self._pending = first
        return True
