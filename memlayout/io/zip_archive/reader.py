"""Reading torch's zips with pread and `struct`, without `zipfile` and without torch (see the package's docstring)."""

from __future__ import annotations

import functools
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import NamedTuple

from memlayout.errors import CorruptCheckpointError
from memlayout.io.zip_archive.records import (
    CENTRAL_MAGIC,
    DEFLATED,
    END_MAGIC,
    END_RECORD,
    LOCAL_HEADER,
    LOCAL_HEADER_MAGIC,
    SATURATED,
    STORED,
    ZIP64_END_MAGIC,
    ZIP64_END_RECORD,
    ZIP64_EXTRA_ID,
    ZIP64_LOCATOR,
    ZIP64_LOCATOR_MAGIC,
)

ReadAt = Callable[[int, int], bytes]
"""(length, absolute offset) -> bytes: how an archive's bytes are read. `os.pread` on the
file for a local file; byte ranges over the network for a remote one."""

_LOCAL_LENGTHS = struct.Struct("<4s22xHH")
"""A local header's magic and its file name and extra field lengths."""
LOCAL_HEADER_SIZE = LOCAL_HEADER.size
"""The fixed part of a local header: what a reader must fetch to find a record's data."""
_HEADER_BLOCK = 64 << 10
"""Local headers this close together are read with one pread (see `ZipReader.record_spans`)."""
_CENTRAL_FIELDS = struct.Struct("<4s4xHH4xIIIHHH8xI")
"""The fields of a central directory entry memlayout reads: magic, flags, method,
CRC-32, compressed size, size, name/extra/comment lengths and local header offset
(the rest is padding here, so that unpacking builds fewer objects per entry)."""
# The end record sits within its own size plus the longest possible comment.
_END_SEARCH = END_RECORD.size + 0xFFFF
# A central directory bigger than this is no small archive: format detection gives
# up on it, and the loader that reads it in full reports what is wrong.
_DETECTION_DIRECTORY_LIMIT = 64 << 20


class ZipEntry(NamedTuple):
    """What memlayout needs of one zip directory entry (a NamedTuple: built once per record)."""

    name: str
    method: int
    compressed_size: int
    size: int
    header_offset: int
    """Where the entry's local header starts, counted from the archive's start."""
    crc: int


class RecordSpans(NamedTuple):
    """Where the uncompressed records of one folder lie, keyed by the name below the folder."""

    starts: dict[str, int]
    """Absolute offset in the file of each record's byte 0."""
    sizes: dict[str, int]
    checksums: dict[str, int]
    """The CRC-32 the directory records for each."""


def archive_prefix(names: Iterable[str]) -> str:
    """The archive's top folder ("archive/"), as torch's reader finds it.

    torch's reader (caffe2/serialize/inline_container.cc) takes the folder of the
    first entry and refuses an archive with any entry outside it; reading another
    folder's data.pkl than torch would is how a scanner gets fooled, so the same
    rules hold here.

    Raises:
        CorruptCheckpointError: no `<folder>/data.pkl`, or entries outside the folder.
    """
    ordered = list(names)
    first = ordered[0] if ordered else ""
    prefix = first[: first.find("/") + 1] if "/" in first else ""
    if not prefix or f"{prefix}data.pkl" not in ordered:
        raise CorruptCheckpointError("the zip has no <archive>/data.pkl: it is not a torch.save file")
    outside = next((name for name in ordered if not name.startswith(prefix)), None)
    if outside is not None:
        raise CorruptCheckpointError(
            f"the zip holds {outside} outside its archive folder {prefix}, which torch's reader refuses"
        )
    return prefix


class ArchiveFile:
    """pread access to an archive that is bytes `base .. base + size` of an open file.

    Metadata never goes through a memory map: touching one byte of a map maps the
    whole page-cache folio behind it, so reading the 400 local headers of a 4 GiB
    checkpoint through a map cost 3.3 ms and made closing it slow, against 0.24 ms
    with pread, whatever the file size. Every offset read from the zip is checked
    against `size` before its data is used.
    """

    def __init__(self, fd: int, size: int, base: int = 0, read_at: ReadAt | None = None) -> None:
        self.fd = fd
        self.size = size
        self.base = base
        self.read_at: ReadAt = read_at if read_at is not None else functools.partial(os.pread, fd)

    def read(self, offset: int, length: int, what: str) -> bytes:
        """`length` bytes from `offset` (counted from the archive's start).

        Raises:
            CorruptCheckpointError: fewer bytes are there.
        """
        # Offsets come from the file: one past the end (or past what pread takes,
        # 2**63) is damage, not an OverflowError.
        if offset < 0 or length < 0 or offset + length > self.size:
            raise CorruptCheckpointError(f"{what} runs past the end of the file")
        data = self.read_at(length, self.base + offset)
        if len(data) != length:
            raise CorruptCheckpointError(f"{what} runs past the end of the file")
        return data


def _end_of_directory(file: ArchiveFile) -> tuple[int, int, int]:
    """(entry count, directory offset, directory size) from the end records."""
    # An archive without a comment (torch writes none) ends with its end record:
    # try those few bytes first, and search the longest comment's span only if
    # they are not it. Over HTTP that is the difference between 42 bytes and 64 KiB.
    short = min(file.size, END_RECORD.size + ZIP64_LOCATOR.size)
    tail = file.read(file.size - short, short, "the zip's end record")
    at = len(tail) - END_RECORD.size
    if at < 0 or tail[at : at + 4] != END_MAGIC or tail[-2:] != b"\x00\x00":
        tail_start = max(0, file.size - _END_SEARCH - ZIP64_LOCATOR.size)
        tail = file.read(tail_start, file.size - tail_start, "the zip's end record")
        at = tail.rfind(END_MAGIC)
    if at < 0 or at + END_RECORD.size > len(tail):
        raise CorruptCheckpointError("the zip's end-of-directory record is missing")
    _, _, _, _, count, directory_size, directory_offset, _ = END_RECORD.unpack_from(tail, at)
    locator_at = at - ZIP64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at : locator_at + 4] == ZIP64_LOCATOR_MAGIC:
        # Archives over 4 GiB (or 65535 entries) keep the real values in the zip64
        # end record; torch's writer always adds one.
        _, _, end64_at, _ = ZIP64_LOCATOR.unpack_from(tail, locator_at)
        end64 = file.read(end64_at, ZIP64_END_RECORD.size, "the zip64 end record")
        if end64[:4] != ZIP64_END_MAGIC:
            raise CorruptCheckpointError("the zip64 end-of-directory record is damaged")
        fields = ZIP64_END_RECORD.unpack(end64)
        count, directory_size, directory_offset = fields[7], fields[8], fields[9]
    if directory_offset + directory_size > file.size:
        raise CorruptCheckpointError("the zip directory lies past the end of the file")
    return count, directory_offset, directory_size


def _zip64_values(extra: bytes, wanted: int) -> list[int]:
    # The zip64 extra field holds, in order, only those of (size, compressed size,
    # header offset) whose 32-bit field was saturated at 0xFFFFFFFF.
    at = 0
    while at + 4 <= len(extra):
        header_id, length = struct.unpack_from("<HH", extra, at)
        if header_id == ZIP64_EXTRA_ID:
            if length >= 8 * wanted and at + 4 + 8 * wanted <= len(extra):
                return list(struct.unpack_from(f"<{wanted}Q", extra, at + 4))
            break
        at += 4 + length
    raise CorruptCheckpointError("a zip entry over 4 GiB lacks its zip64 sizes")


def read_directory(file: ArchiveFile) -> list[ZipEntry]:
    """Every entry of the zip's central directory.

    Raises:
        CorruptCheckpointError: the file is no zip, or its directory is damaged.
    """
    count, directory_offset, directory_size = _end_of_directory(file)
    directory = file.read(directory_offset, directory_size, "the zip directory")
    entries = []
    unpack = _CENTRAL_FIELDS.unpack_from
    fixed = _CENTRAL_FIELDS.size
    # A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the
    # same entry from a tuple of its fields in compiled code, in half the time.
    new_entry = tuple.__new__
    at = 0
    for _ in range(count):
        if at + fixed > directory_size:
            raise CorruptCheckpointError("the zip directory ends before its last entry")
        magic, flags, method, crc, compressed, size, name_length, extra_length, comment_length, offset = unpack(
            directory, at
        )
        if magic != CENTRAL_MAGIC:
            raise CorruptCheckpointError("the zip directory is damaged")
        name_end = at + fixed + name_length
        # Bit 11 marks UTF-8 names; torch writes ASCII, other writers may use cp437.
        name = directory[at + fixed : name_end].decode("utf-8" if flags & 0x800 else "cp437")
        if compressed == SATURATED or size == SATURATED or offset == SATURATED:
            saturated = sum(1 for value in (size, compressed, offset) if value == SATURATED)
            values = iter(_zip64_values(directory[name_end : name_end + extra_length], saturated))
            size = next(values) if size == SATURATED else size
            compressed = next(values) if compressed == SATURATED else compressed
            offset = next(values) if offset == SATURATED else offset
        entries.append(new_entry(ZipEntry, (name, method, compressed, size, offset, crc)))
        at = name_end + extra_length + comment_length
    return entries


MAX_INFLATION_RATIO = 200
"""Deflate shrinks pickles, JSON and code about 3-10 times; a zip bomb 1000 times."""
MAX_INFLATED_ALWAYS = 16 << 20


def refuse_inflation(name: str, compressed_size: int, size: int) -> None:
    """Refuse to inflate a member that claims far more bytes than deflate gives honest data.

    torch never deflates a record; tools that recompress an archive do, and a
    zip bomb turns 1 MiB into 1 GiB. Inflating stays within 200x the compressed
    size (or 16 MiB), so memory stays proportional to the file.

    Raises:
        CorruptCheckpointError: the member would inflate beyond that.
    """
    if size > max(MAX_INFLATED_ALWAYS, MAX_INFLATION_RATIO * compressed_size):
        raise CorruptCheckpointError(
            f"{name} would inflate from {compressed_size:,} to {size:,} bytes, "
            f"more than {MAX_INFLATION_RATIO}x: a zip bomb, not a checkpoint",
            "do not load this file",
        )


def _refuse_ambiguous_names(entries: list[ZipEntry], what: str) -> None:
    # torch's reader (miniz) finds a record by a case-insensitive binary search of
    # the directory, so of two entries that differ only in case, or not at all, it
    # may read either; a reader that picked the other could report a clean pickle
    # that torch.load never loads.
    if len(set(map(str.lower, (entry.name for entry in entries)))) == len(entries):
        return  # every name distinct without case, as in every archive torch writes
    seen: dict[str, str] = {}
    for entry in entries:
        folded = entry.name.lower()
        if folded in seen:
            names = f"{entry.name} twice" if seen[folded] == entry.name else f"both {seen[folded]} and {entry.name}"
            raise CorruptCheckpointError(
                f"{what} holds {names}; torch's reader matches entry names without case and may load either"
            )
        seen[folded] = entry.name


class ZipReader:
    """A zip archive's directory and members, read with pread from an open file.

    Args:
        fd: The file, open for reading (the caller closes it).
        size: The archive's length in bytes.
        base: Where the archive starts in the file (0 for a file that is one archive).
        what: The archive as error messages name it (its path).
        read_at: How bytes are read, when not by pread on `fd` (a remote file).
        header_block: Local headers this close together are read at once; a remote
            reader, which fetches them all beforehand, reads each alone.

    Raises:
        CorruptCheckpointError: the file is no zip, or its directory is damaged;
            the message says "WHAT is not a readable zip archive: ...".
    """

    def __init__(
        self, fd: int, size: int, base: int = 0, what: str = "the file", read_at: ReadAt | None = None,
        header_block: int = _HEADER_BLOCK,
    ) -> None:
        self.file = ArchiveFile(fd, size, base, read_at)
        self.what = what
        self.header_block = header_block
        try:
            self.entries = read_directory(self.file)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise CorruptCheckpointError(f"{what} is not a readable zip archive: {exc}") from exc
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{what} is not a readable zip archive: {exc.message}", exc.hint) from exc
        self.by_name = {entry.name: entry for entry in self.entries}
        _refuse_ambiguous_names(self.entries, what)

    @property
    def names(self) -> list[str]:
        """Every entry's name, in directory order."""
        return list(self.by_name)

    def entry(self, name: str) -> ZipEntry:
        """The entry called `name`.

        Raises:
            CorruptCheckpointError: the archive has no such entry.
        """
        found = self.by_name.get(name)
        if found is None:
            raise CorruptCheckpointError(f"{self.what} has no {name}")
        return found

    def data_start(self, entry: ZipEntry) -> int:
        """Where an entry's data starts, absolute in the file.

        The local header's extra field differs from the directory's (torch pads it
        to align the data to 64 bytes), so the offset comes from the local header.

        Raises:
            CorruptCheckpointError: the local header is damaged, or the data runs
                past the end of the archive.
        """
        magic, name_length, extra_length = _LOCAL_LENGTHS.unpack(
            self.file.read(entry.header_offset, LOCAL_HEADER.size, f"the zip entry {entry.name}")
        )
        if magic != LOCAL_HEADER_MAGIC:
            raise CorruptCheckpointError(f"the zip entry for {entry.name} is damaged")
        start: int = entry.header_offset + LOCAL_HEADER.size + name_length + extra_length
        if start + entry.compressed_size > self.file.size:
            raise CorruptCheckpointError(f"the zip entry {entry.name} runs past the end of the file")
        return self.file.base + start

    def read(self, name: str) -> bytes:
        """A member's bytes, inflated if deflated, checked against its recorded CRC-32.

        Raises:
            CorruptCheckpointError: no such member, a damaged header or stream, an
                unknown compression method, or a checksum mismatch.
        """
        entry = self.entry(name)
        if entry.method == DEFLATED:
            refuse_inflation(entry.name, entry.compressed_size, entry.size)
        data = self.file.read(self.data_start(entry) - self.file.base, entry.compressed_size, entry.name)
        if entry.method == DEFLATED:
            try:
                # Never more than the directory says: a stream that goes on is damage.
                inflater = zlib.decompressobj(-15)
                data = inflater.decompress(data, entry.size + 1)
            except zlib.error as exc:
                raise CorruptCheckpointError(f"{entry.name} cannot be decompressed: {exc}") from exc
        elif entry.method != STORED:
            raise CorruptCheckpointError(f"{entry.name} uses zip compression method {entry.method}, which torch never "
                                         "writes")
        if len(data) != entry.size or zlib.crc32(data) != entry.crc:
            raise CorruptCheckpointError(f"{entry.name} fails its zip checksum; the file is damaged")
        return data

    def record_spans(self, folder: str) -> RecordSpans:
        """Where the stored records under `folder` (e.g. "archive/data/") lie in the file.

        Raises:
            CorruptCheckpointError: a record is compressed, damaged, or runs past
                the end of the archive.
        """
        skip = len(folder)
        starts: dict[str, int] = {}
        sizes: dict[str, int] = {}
        checksums: dict[str, int] = {}
        records: list[ZipEntry] = []
        for entry in self.entries:
            if not entry.name.startswith(folder) or entry.name.endswith("/"):
                continue
            if entry.method != STORED:
                raise CorruptCheckpointError(f"storage record {entry.name} is compressed; torch never writes that")
            records.append(entry)
        # The data offset lives in each record's local header. Records of small
        # tensors lie a few hundred bytes apart, so local headers within
        # _HEADER_BLOCK bytes of each other are read with one pread: 40,000 tensors
        # take a few hundred reads, not 40,000. A header far from the next one (a
        # big tensor between them) still costs one 30-byte read, nothing more.
        read_at, unpack_from, header_size = self.file.read_at, _LOCAL_LENGTHS.unpack_from, LOCAL_HEADER.size
        header_block = self.header_block
        # Zip offsets count from the window's start; a header past the window's end
        # yields a data start past it too, which the bounds check below refuses.
        base = self.file.base
        end = base + self.file.size
        count = len(records)
        index = 0
        while index < count:
            first = records[index].header_offset
            last = index
            while (
                last + 1 < count
                and first <= records[last + 1].header_offset
                and records[last + 1].header_offset + header_size - first <= header_block
            ):
                last += 1
            block = read_at(records[last].header_offset + header_size - first, base + first)
            for name, _, _, size, header_offset, crc in records[index : last + 1]:
                at = header_offset - first
                if at + header_size > len(block):
                    raise CorruptCheckpointError(f"the zip entry {name} runs past the end of the file")
                magic, name_length, extra_length = unpack_from(block, at)
                start = base + header_offset + header_size + name_length + extra_length
                if magic != LOCAL_HEADER_MAGIC or start + size > end:
                    raise CorruptCheckpointError(f"the zip entry for {name} is damaged")
                key = name[skip:]
                starts[key] = start
                sizes[key] = size
                checksums[key] = crc
            index = last + 1
        return RecordSpans(starts, sizes, checksums)


def central_directory_bytes(path: str) -> bytes:
    """The raw central directory of a zip file, or b"" when it cannot be found.

    Format detection only asks whether some entry name occurs, and one read of the
    directory plus a substring search costs microseconds, where parsing every
    entry costs a walk of the whole directory.

    Args:
        path: A file that starts like a zip.

    Returns:
        The directory bytes (entry headers and names), or b"" when the end records
        are missing or damaged, or the directory is implausibly large.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""
    try:
        file = ArchiveFile(fd, os.fstat(fd).st_size)
        _, directory_offset, directory_size = _end_of_directory(file)
        if directory_size > _DETECTION_DIRECTORY_LIMIT:
            return b""
        return file.read(directory_offset, directory_size, "the zip directory")
    except (OSError, struct.error, CorruptCheckpointError):
        return b""
    finally:
        os.close(fd)
