"""Pickles however they are wrapped: compressed streams, zip and tar archives, nested, read by content.

`joblib.dump(obj, f, compress=...)` writes its pickle through zlib, gzip, bz2,
lzma, xz or lz4; `torch.save` writes into whatever file object it is given, a
`gzip.open` or `lzma.open` one included; checkpoints travel as `model.zip`,
`*.tar.gz` and archives of archives. Each loads with one call that unpacks and
unpickles (`joblib.load`, `torch.load(gzip.open(f))`), running what the pickle
names. memlayout reads them the same way, without running anything:

- a compressed stream (`memlayout.load.codecs`) is decompressed forward, a megabyte
  at a time, and what it holds is recognized by its first bytes, as a file is;
- a tar archive is read member by member, forward (`tarfile` in stream mode), so a
  `.tar.gz` is decompressed once;
- a zip archive is read member by member with `zipfile`, each member inflated forward;
- a pickle (a joblib file, a bare pickle) is unpickled as it streams by, with the
  pure-Python restricted unpickler (`StreamedUnpickler`), joblib's arrays stepped
  over; every later pickle of the stream is read too, as for a file;
- anything that needs to be read at random (a torch.save zip, a legacy torch.save
  file, an `.npy`, safetensors) is copied into an anonymous temporary file, which
  has no name and disappears when closed, and read there by its own loader;
- anything else is data, and said to be ("text", "a PNG image").

Every member is one `MemberRecord` of the source's `contents`, and every global
any pickle inside names is one of its `pickle_globals`, with the member it came
from. Containers are opened `codecs.MAX_DEPTH` deep, and one file may unpack to
`codecs.MAX_UNPACKED_BYTES` and hold `codecs.MAX_MEMBERS` members; past a cap the
file is refused, one error, as damaged input is.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple

from memlayout.errors import (
    CorruptCheckpointError,
    DamagedPickleError,
    MemlayoutError,
    UnpackLimitError,
)
from memlayout.format_bytes import human_bytes
from memlayout.io.zip_archive import ZipReader
from memlayout.io.zip_archive.records import DEFLATED, STORED
from memlayout.load import FORMATS, HEAD_BYTES, Format, codecs
from memlayout.load.array_pickles import ARRAY_GLOBALS, SequentialReads
from memlayout.load.codecs import (
    CHUNK,
    DecompressedStream,
    UnpackBudget,
    opens_a_stream,
    readable,
)
from memlayout.load.data_kinds import describe_data
from memlayout.load.detect import (
    CONTAINER_FORMATS,
    compression_of,
    has_proto_signature,
    has_tar_magic,
    is_npy,
    is_zip,
    looks_like_safetensors,
    opens_like_a_pickle,
    unopened_archive,
)
from memlayout.load.records import LoadedSource, MemberRecord, PickleGlobal
from memlayout.load.restricted_pickle import run_unpickler
from memlayout.load.streamed_pickle import StreamedUnpickler

_DIRECTORY_FORMATS = ("dcp", "hf-dir")
_MAX_LATER_PICKLES = 64
_SHOWN = 12


class Found(NamedTuple):
    record: MemberRecord
    globals: list[PickleGlobal]
    source: LoadedSource | None
    """A checkpoint read by its loader, tensors and all; closed unless the container adopts it."""


def _join(member: str, name: str) -> str:
    return f"{member}!{name}" if member else name


class _Rewound(io.RawIOBase):
    """A forward-only stream whose first bytes were read to recognize it, handing them back first."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        super().__init__()
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _read_head(stream: BinaryIO) -> bytes:
    head = b""
    while len(head) < HEAD_BYTES:
        more = stream.read(HEAD_BYTES - len(head))
        if not more:
            break
        head += more
    return head


@contextlib.contextmanager
def _anonymous_file() -> Iterator[tuple[int, str]]:
    """A temporary file and a path that opens it: on Linux one with no name at all (O_TMPFILE), else unlinked after."""
    folder = tempfile.gettempdir()
    flag = getattr(os, "O_TMPFILE", 0)
    fd, path, named = -1, "", False
    if flag and os.path.isdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            fd = os.open(folder, flag | os.O_RDWR, 0o600)
            path = f"/proc/self/fd/{fd}"
    if fd < 0:
        fd, path = tempfile.mkstemp(prefix="memlayout-unpack-")
        named = True
    try:
        yield fd, path
    finally:
        os.close(fd)
        if named:
            with contextlib.suppress(OSError):
                os.unlink(path)


class Unpacking:
    """One file's unpacking: what was found in it, and the budget its caps are kept with."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.budget = UnpackBudget(path)
        self.found: list[Found] = []

    def where(self, member: str) -> str:
        return f"{self.path}: {member}" if member else self.path

    def close(self, keep: LoadedSource | None = None) -> None:
        for found in self.found:
            if found.source is not None and found.source is not keep:
                found.source.close()

    def _deeper(self, within: tuple[str, ...], container: str) -> tuple[str, ...]:
        deeper = (*within, container)
        if len(deeper) > codecs.MAX_DEPTH:
            raise UnpackLimitError(
                f"{self.path} nests containers more than {codecs.MAX_DEPTH} deep ({' > '.join(deeper)}): memlayout "
                f"reads {codecs.MAX_DEPTH} and does not vouch for what the last one holds"
            )
        return deeper

    def _data(self, member: str, within: tuple[str, ...], what: str) -> None:
        self.found.append(Found(MemberRecord(member, within, "data", what), [], None))

    def stream(self, stream: BinaryIO, member: str, within: tuple[str, ...], encrypted: bool = False) -> None:
        """Read one stream (a file, a member, a decompressed stream) by its content.

        `encrypted`: the zip member is flagged encrypted; unless its bytes are a pickle or a
        checkpoint in the clear, what it holds cannot be known and is refused, never cleared.
        """
        try:
            head = _read_head(stream)
        except CorruptCheckpointError:
            if encrypted:
                raise _encrypted(self.where(member)) from None
            raise
        rewound = io.BufferedReader(_Rewound(head, stream), CHUNK)
        codec = compression_of(head)
        if codec is not None and opens_a_stream(codec, head):
            why = readable(codec)
            if why:
                raise CorruptCheckpointError(f"{self.where(member)} is {why}: what it holds is not audited",
                                             "decompress it yourself and inspect what it holds")
            deeper = self._deeper(within, codec)
            self.stream(io.BufferedReader(DecompressedStream(codec, rewound, self.budget, self.where(member)), CHUNK),
                        member, deeper)
            return
        archive = unopened_archive(head)
        if archive is not None:
            raise CorruptCheckpointError(f"{self.where(member)} is {archive}, which memlayout does not open: what "
                                         "it holds is not audited", "extract it and inspect the files")
        if has_tar_magic("", head) and not _legacy_tar_member(head):
            self.tar(rewound, member, self._deeper(within, "tar"))
        elif is_zip("", head) or _needs_random_access(head):
            self._spooled(rewound, member, within, head)
        elif opens_like_a_pickle("", head):
            self.pickle(rewound, member, within, head)
        elif encrypted:
            raise _encrypted(self.where(member))
        else:
            self._data(member, within, describe_data(head))

    def tar(self, stream: BinaryIO, member: str, within: tuple[str, ...]) -> None:
        """Read a tar archive's members as they stream by."""
        import tarfile

        try:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for info in archive:
                    self.budget.add_member()
                    name = _join(member, info.name)
                    if info.isdir():
                        continue
                    if info.issym() or info.islnk():
                        self._data(name, within, f"a link to {info.linkname}, not followed")
                    elif not info.isfile():
                        self._data(name, within, "a special file (a device or a pipe), no contents")
                    else:
                        handle = archive.extractfile(info)
                        assert handle is not None  # a regular file has contents
                        self.stream(handle, name, within)  # type: ignore[arg-type]
        except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"{self.where(member)}: the tar archive is damaged: {exc}") from exc

    def zip(self, path: str, member: str, within: tuple[str, ...]) -> None:
        """Read a zip archive's members, each inflated forward.

        memlayout's own zip reader, as for torch's zips: like torch's, it reads a member
        whatever its flag bits say and wherever its local header's name differs, so a
        member hidden from stricter readers (picklescan's malicious1_0x1.zip and its
        kin) is read as a lenient loader reads it. A member marked encrypted whose
        bytes are no pickle or checkpoint in the clear cannot be vouched for.
        """
        where = self.where(member)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            archive = ZipReader(fd, os.fstat(fd).st_size, what=where)
            for entry in archive.entries:
                self.budget.add_member()
                if entry.name.endswith("/"):
                    continue
                name = _join(member, entry.name)
                if entry.method not in (STORED, DEFLATED):
                    raise CorruptCheckpointError(f"{self.where(name)} uses zip compression method {entry.method}, "
                                                 "which memlayout does not read: what it holds is not audited",
                                                 "extract it and inspect the files")
                raw: BinaryIO = io.BufferedReader(_Slice(fd, archive.data_start(entry), entry.compressed_size), CHUNK)
                if entry.method == DEFLATED:
                    raw = io.BufferedReader(DecompressedStream("deflate", raw, self.budget, self.where(name)), CHUNK)
                # The local header's general-purpose flags: bit 0 marks the member encrypted.
                flags = int.from_bytes(os.pread(fd, 2, entry.header_offset + 6), "little")
                self.stream(raw, name, within, encrypted=bool(flags & 0x1))
        finally:
            os.close(fd)

    def pickle(self, stream: BinaryIO, member: str, within: tuple[str, ...], head: bytes) -> None:
        """Unpickle a stream as it goes by: a joblib file, a bare pickle and any pickles after it."""
        reads = SequentialReads(stream, codecs.MAX_PICKLE_BYTES, self.where(member))
        unpickler = StreamedUnpickler(reads)
        where = self.where(member)
        try:
            run_unpickler(unpickler, f"{where}: the pickle")
        except CorruptCheckpointError as exc:
            if not unpickler.referenced and not has_proto_signature(head):
                self._data(member, within, describe_data(head))  # opcodes by chance, no pickle
                return
            raise _damaged(exc, unpickler.referenced.values()) from exc.__cause__
        referenced = dict(unpickler.referenced)
        for _ in range(_MAX_LATER_PICKLES):
            if not stream.peek(1):  # type: ignore[attr-defined]
                break
            later = StreamedUnpickler(reads)
            try:
                run_unpickler(later, f"{where}: a later pickle")
            except CorruptCheckpointError:
                referenced.update(later.referenced)
                break
            finally:
                referenced.update(later.referenced)
        globals_ = [_array_globals_allowed(found)._replace(member=member) for found in referenced.values()]
        self.found.append(Found(MemberRecord(member, within, "pickle"), globals_, None))

    def _spooled(self, stream: BinaryIO, member: str, within: tuple[str, ...], head: bytes) -> None:
        with _anonymous_file() as (fd, path):
            written = 0
            while chunk := stream.read(CHUNK):
                written += len(chunk)
                if written > codecs.MAX_UNPACKED_BYTES:
                    raise UnpackLimitError(f"{self.where(member)} is more than "
                                           f"{human_bytes(codecs.MAX_UNPACKED_BYTES)}, "
                                           "memlayout's cap on what it copies out of a container to read")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            self._file(path, member, within, head)

    def _file(self, path: str, member: str, within: tuple[str, ...], head: bytes) -> None:
        """Read a file copied out of a container with the loader its content calls for."""
        fmt = _file_format(path, head)
        if fmt is None:
            self._data(member, within, describe_data(head))
            return
        if fmt.name == "zip":
            self.zip(path, member, self._deeper(within, "zip"))
            return
        try:
            source: LoadedSource = _load(fmt, path)
        except DamagedPickleError as exc:
            raise DamagedPickleError(exc.message.replace(path, self.where(member)), exc.hint, exc.named) from exc
        except MemlayoutError as exc:
            raise type(exc)(exc.message.replace(path, self.where(member)), exc.hint) from exc
        source.path = self.where(member)
        globals_ = [found._replace(member=member) for found in source.pickle_globals]
        self.found.append(Found(MemberRecord(member, within, source.format), globals_, source))


def _load(fmt: Format, path: str) -> LoadedSource:
    import importlib

    loaded: LoadedSource = getattr(importlib.import_module(fmt.module), fmt.load)(path)
    return loaded


def _file_format(path: str, head: bytes) -> Format | None:
    import importlib

    for fmt in FORMATS:
        if fmt.name in _DIRECTORY_FORMATS or (fmt.name in CONTAINER_FORMATS and fmt.name != "zip"):
            continue
        if not fmt.detect(path, head):
            continue
        if fmt.confirm is None or getattr(importlib.import_module(fmt.module), fmt.confirm)(path, head):
            return fmt
    return None


class _Slice(io.RawIOBase):
    """`size` bytes of a file from `start`, read forward with pread (a zip member's stored bytes)."""

    def __init__(self, fd: int, start: int, size: int) -> None:
        super().__init__()
        self._fd, self._at, self._end = fd, start, start + size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = os.pread(self._fd, min(len(buffer), self._end - self._at), self._at)
        self._at += len(data)
        buffer[: len(data)] = data
        return len(data)


def _encrypted(where: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{where} is encrypted: memlayout cannot read what it holds, nor vouch for it",
                                  "decrypt the archive and inspect its files")


def _legacy_tar_member(head: bytes) -> bool:
    # torch.save's tar format: members sys_info, pickle, tensors, storages. Read as a
    # plain tar, its pickles are still read, but not its tensors: it is copied out
    # and read by its own loader instead.
    return head[:100].rstrip(b"\x00") in (b"sys_info", b"pickle", b"tensors", b"storages")


def _needs_random_access(head: bytes) -> bool:
    from memlayout.load.legacy import is_legacy_torch

    return (is_npy("", head) or looks_like_safetensors(head) or _legacy_tar_member(head)
            or is_legacy_torch("", head))


def _array_globals_allowed(found: PickleGlobal) -> PickleGlobal:
    if not found.allowed and (found.module, found.name) in ARRAY_GLOBALS:
        return found._replace(allowed=True)
    return found


def _damaged(exc: CorruptCheckpointError, referenced: Any) -> CorruptCheckpointError:
    refused = sorted(f"{g.module}.{g.name}" for g in referenced if not g.allowed)
    if not refused:
        return exc
    shown = ", ".join(refused[:_SHOWN]) + (f" and {len(refused) - _SHOWN} more" if len(refused) > _SHOWN else "")
    return DamagedPickleError(
        f"{exc.message}; before that point it names {shown}, which unpickling would import and may call before "
        "it failed", "never load it; if you expected a model, re-export it from its source",
        named=tuple((g.module, g.name) for g in referenced if not g.allowed),
    )
