"""torch's zip archives, read and written: the one module that knows their layout.

torch.save, torch.jit.save and torch.export all write zips through the same
miniz-based writer (caffe2/serialize/inline_container.cc), and memlayout reads
them without `zipfile` and without torch:

- Reading parses the directory with `struct` over bytes read with pread.
  `zipfile.ZipFile` builds a `ZipInfo` per entry (decoding extra fields, times and
  flags nobody here reads) and seeks and reads the file for each, which made it the
  largest single cost of listing a 400-tensor checkpoint. A checkpoint needs a few
  fields per entry, and torch stores its records uncompressed, so the walk is one
  `unpack_from` per entry plus one 30-byte pread per record for its local header.
- Writing lays out records exactly as torch's writer does (see `RecordLayout`), so
  a rewritten checkpoint is the archive torch.save would have written, record by
  record, while its bytes are moved by the kernel rather than by torch.

An archive may be a window of a larger file: torch.export's older `.pt2` layout
stores whole torch.save archives, uncompressed, as members of its own zip. Offsets
inside an archive count from the window's start; the data offsets handed back are
absolute in the file, so one memory map of the outer file serves nested records.
"""

from __future__ import annotations

import functools
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from memlayout.errors import CorruptCheckpointError

ReadAt = Callable[[int, int], bytes]
"""(length, absolute offset) -> bytes: how an archive's bytes are read. `os.pread` on the
file for a local file; byte ranges over the network for a remote one."""

# Fixed-size parts of the zip records (APPNOTE.TXT 4.3.7, 4.3.9, 4.3.12, 4.3.14-16).
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_HEADER_MAGIC = b"PK\x03\x04"
_LOCAL_LENGTHS = struct.Struct("<4s22xHH")
"""A local header's magic and its file name and extra field lengths."""
_HEADER_BLOCK = 64 << 10
LOCAL_HEADER_SIZE = _LOCAL_HEADER.size
"""The fixed part of a local header: what a reader must fetch to find a record's data."""
"""Local headers this close together are read with one pread (see `ZipReader.record_spans`)."""
_CENTRAL_ENTRY = struct.Struct("<4sHHHHHHIIIHHHHHII")
_CENTRAL_FIELDS = struct.Struct("<4s4xHH4xIIIHHH8xI")
"""The fields of a central directory entry memlayout reads: magic, flags, method,
CRC-32, compressed size, size, name/extra/comment lengths and local header offset
(the rest is padding here, so that unpacking builds fewer objects per entry)."""
_CENTRAL_MAGIC = b"PK\x01\x02"
_END_RECORD = struct.Struct("<4sHHHHIIH")
_END_MAGIC = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_LOCATOR_MAGIC = b"PK\x06\x07"
_ZIP64_END_RECORD = struct.Struct("<4sQHHIIQQQQ")
_ZIP64_END_MAGIC = b"PK\x06\x06"
_DESCRIPTOR_MAGIC = b"PK\x07\x08"
_DESCRIPTOR_32 = struct.Struct("<4sIII")
_DESCRIPTOR_64 = struct.Struct("<4sIQQ")
_ZIP64_EXTRA_ID = 0x0001
_STORED, _DEFLATED = 0, 8
_SATURATED = 0xFFFFFFFF
# The end record sits within its own size plus the longest possible comment.
_END_SEARCH = _END_RECORD.size + 0xFFFF
# A central directory bigger than this is no small archive: format detection gives
# up on it, and the loader that reads it in full reports what is wrong.
_DETECTION_DIRECTORY_LIMIT = 64 << 20

# What `zipfile` raises on a damaged archive (zlib.error: inside its decompressor).
# Only the one path that still needs `zipfile` (a nested archive that some other
# tool recompressed) catches these; everything else raises CorruptCheckpointError.
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, KeyError, NotImplementedError)


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


def torch_archive_name(path: str) -> str:
    """The top folder torch.save gives an archive written to `path`.

    torch's writer names it after the file, without folders or extension
    (`out/model.pt` -> "model"); a name with nothing left (".pt") gets "archive",
    as torch names archives written to a buffer.
    """
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    stem = base[: base.rfind(".")] if "." in base else base
    return stem or "archive"


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
    short = min(file.size, _END_RECORD.size + _ZIP64_LOCATOR.size)
    tail = file.read(file.size - short, short, "the zip's end record")
    at = len(tail) - _END_RECORD.size
    if at < 0 or tail[at : at + 4] != _END_MAGIC or tail[-2:] != b"\x00\x00":
        tail_start = max(0, file.size - _END_SEARCH - _ZIP64_LOCATOR.size)
        tail = file.read(tail_start, file.size - tail_start, "the zip's end record")
        at = tail.rfind(_END_MAGIC)
    if at < 0 or at + _END_RECORD.size > len(tail):
        raise CorruptCheckpointError("the zip's end-of-directory record is missing")
    _, _, _, _, count, directory_size, directory_offset, _ = _END_RECORD.unpack_from(tail, at)
    locator_at = at - _ZIP64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at : locator_at + 4] == _ZIP64_LOCATOR_MAGIC:
        # Archives over 4 GiB (or 65535 entries) keep the real values in the zip64
        # end record; torch's writer always adds one.
        _, _, end64_at, _ = _ZIP64_LOCATOR.unpack_from(tail, locator_at)
        end64 = file.read(end64_at, _ZIP64_END_RECORD.size, "the zip64 end record")
        if end64[:4] != _ZIP64_END_MAGIC:
            raise CorruptCheckpointError("the zip64 end-of-directory record is damaged")
        fields = _ZIP64_END_RECORD.unpack(end64)
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
        if header_id == _ZIP64_EXTRA_ID:
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
        if magic != _CENTRAL_MAGIC:
            raise CorruptCheckpointError("the zip directory is damaged")
        name_end = at + fixed + name_length
        # Bit 11 marks UTF-8 names; torch writes ASCII, other writers may use cp437.
        name = directory[at + fixed : name_end].decode("utf-8" if flags & 0x800 else "cp437")
        if compressed == _SATURATED or size == _SATURATED or offset == _SATURATED:
            saturated = sum(1 for value in (size, compressed, offset) if value == _SATURATED)
            values = iter(_zip64_values(directory[name_end : name_end + extra_length], saturated))
            size = next(values) if size == _SATURATED else size
            compressed = next(values) if compressed == _SATURATED else compressed
            offset = next(values) if offset == _SATURATED else offset
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
            self.file.read(entry.header_offset, _LOCAL_HEADER.size, f"the zip entry {entry.name}")
        )
        if magic != _LOCAL_HEADER_MAGIC:
            raise CorruptCheckpointError(f"the zip entry for {entry.name} is damaged")
        start: int = entry.header_offset + _LOCAL_HEADER.size + name_length + extra_length
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
        if entry.method == _DEFLATED:
            refuse_inflation(entry.name, entry.compressed_size, entry.size)
        data = self.file.read(self.data_start(entry) - self.file.base, entry.compressed_size, entry.name)
        if entry.method == _DEFLATED:
            try:
                # Never more than the directory says: a stream that goes on is damage.
                inflater = zlib.decompressobj(-15)
                data = inflater.decompress(data, entry.size + 1)
            except zlib.error as exc:
                raise CorruptCheckpointError(f"{entry.name} cannot be decompressed: {exc}") from exc
        elif entry.method != _STORED:
            raise CorruptCheckpointError(f"{entry.name} uses zip compression method {entry.method}, which torch never writes")
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
            if entry.method != _STORED:
                raise CorruptCheckpointError(f"storage record {entry.name} is compressed; torch never writes that")
            records.append(entry)
        # The data offset lives in each record's local header. Records of small
        # tensors lie a few hundred bytes apart, so local headers within
        # _HEADER_BLOCK bytes of each other are read with one pread: 40,000 tensors
        # take a few hundred reads, not 40,000. A header far from the next one (a
        # big tensor between them) still costs one 30-byte read, nothing more.
        read_at, unpack_from, header_size = self.file.read_at, _LOCAL_LENGTHS.unpack_from, _LOCAL_HEADER.size
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
                if magic != _LOCAL_HEADER_MAGIC or start + size > end:
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


def read_recompressed_archive(path: str, member: str, what: str) -> tuple[str, bytes, dict[str, int]]:
    """Names, `data.pkl` and storage record sizes of a torch archive stored *deflated* in a zip member.

    Some tools recompress a `.pt2` file, which turns its nested torch.save archives
    into deflated members. Their storages are then no bytes of the file, and
    inflating a whole state dict to read them is not what a metadata read should
    cost, so the nested zip is read through `zipfile`'s decompressing stream, which
    keeps memory bounded (seeks re-inflate rather than buffer).

    Args:
        path: The outer zip file.
        member: The deflated member holding a torch archive.
        what: How errors name it.

    Returns:
        (the nested archive's prefix, its data.pkl bytes, storage key -> record size).

    Raises:
        CorruptCheckpointError: either zip is damaged.
    """
    try:
        with zipfile.ZipFile(path) as outer, outer.open(member) as stream, zipfile.ZipFile(stream) as inner:
            prefix = archive_prefix(inner.namelist())
            info = inner.getinfo(f"{prefix}data.pkl")
            if info.compress_type != zipfile.ZIP_STORED:
                refuse_inflation(info.filename, info.compress_size, info.file_size)
            data = inner.read(info)
            folder = f"{prefix}data/"
            sizes = {
                info.filename[len(folder) :]: info.file_size
                for info in inner.infolist()
                if info.filename.startswith(folder) and not info.filename.endswith("/")
            }
    except ZIP_ERRORS as exc:
        raise CorruptCheckpointError(f"{what} is not a readable zip archive: {exc}") from exc
    return prefix, data, sizes


# ---------------------------------------------------------------------------
# Writing, as torch's writer does.

STORAGE_ALIGNMENT = 64
"""torch's `kFieldAlignment`, and what torch.save records in `.storage_alignment`."""
_UTF8 = 0x0800
"""General-purpose flag bit 11: the name is UTF-8."""
_DESCRIPTOR_FOLLOWS = 0x0008
"""General-purpose flag bit 3: sizes and CRC follow the data (set for every non-empty record)."""
_ZIP64_MADE_BY, _ZIP64_NEEDED = 0x031E, 45
_PADDING_ID = b"FB"
"""torch's extra-field id for the padding that aligns a record's data."""


@dataclass(frozen=True)
class RecordLayout:
    """Where one record goes in an archive written as torch's writer writes it.

    torch's writer (miniz with `MZ_ZIP_FLAG_WRITE_ZIP64`) writes each record as a
    local header with zero sizes and CRC, flags 0x0808, zero version and times; an
    extra field that is a zip64 block (uncompressed size and a zero compressed size
    when the record is 4 GiB or more, the header's own offset when that is 4 GiB or
    more) followed by an "FB" block of "Z" bytes padding the data to 64 bytes; the
    data; and a data descriptor with the CRC and sizes, 64-bit when the header had a
    zip64 block. An empty record has neither the descriptor nor its flag. These were
    read off torch.save's own output, for sizes and offsets on both sides of 4 GiB
    (see the tests).
    """

    name: str
    """Full member name, "<archive>/<record>"."""
    size: int
    header_offset: int
    data_offset: int
    extra: bytes
    """The local header's extra field: the zip64 block, if any, then the padding block."""

    @property
    def zip64(self) -> bool:
        return self.size >= _SATURATED or self.header_offset >= _SATURATED

    @property
    def end(self) -> int:
        """Where the next record's local header starts (after the data descriptor)."""
        return self.data_offset + self.size + self.descriptor_size

    @property
    def descriptor_size(self) -> int:
        if self.size == 0:
            return 0
        return _DESCRIPTOR_64.size if self.zip64 else _DESCRIPTOR_32.size

    @property
    def flags(self) -> int:
        return _UTF8 | _DESCRIPTOR_FOLLOWS if self.size else _UTF8

    def local_header(self) -> bytes:
        """The local header and its extra field, ready to write at `header_offset`."""
        encoded = self.name.encode("utf-8")
        fixed = _LOCAL_HEADER.pack(
            _LOCAL_HEADER_MAGIC, 0, self.flags, _STORED, 0, 0, 0, 0, 0, len(encoded), len(self.extra)
        )
        return fixed + encoded + self.extra

    def descriptor(self, crc: int) -> bytes:
        """The data descriptor that follows the data (nothing for an empty record)."""
        if self.size == 0:
            return b""
        if self.zip64:
            return _DESCRIPTOR_64.pack(_DESCRIPTOR_MAGIC, crc, self.size, self.size)
        return _DESCRIPTOR_32.pack(_DESCRIPTOR_MAGIC, crc, self.size, self.size)

    def directory_entry(self, crc: int) -> bytes:
        """This record's central directory entry."""
        encoded = self.name.encode("utf-8")
        size = min(self.size, _SATURATED)
        offset = min(self.header_offset, _SATURATED)
        values = ([self.size, self.size] if self.size >= _SATURATED else []) + (
            [self.header_offset] if self.header_offset >= _SATURATED else []
        )
        extra = struct.pack(f"<HH{len(values)}Q", _ZIP64_EXTRA_ID, 8 * len(values), *values) if values else b""
        fixed = _CENTRAL_ENTRY.pack(
            _CENTRAL_MAGIC, 0, 0, self.flags, _STORED, 0, 0, crc, size, size,
            len(encoded), len(extra), 0, 0, 0, 0, offset,
        )
        return fixed + encoded + extra


def layout_record(name: str, size: int, header_offset: int, alignment: int = STORAGE_ALIGNMENT) -> RecordLayout:
    """Place one record whose local header starts at `header_offset`, as torch's writer would.

    Args:
        name: Full member name.
        size: Its bytes.
        header_offset: Where its local header starts.
        alignment: The data alignment (torch: 64).

    Returns:
        The record's layout.
    """
    zip64_values: list[int] = []
    if size >= _SATURATED:
        # miniz builds the local zip64 block before it knows the compressed size.
        zip64_values += [size, 0]
    if header_offset >= _SATURATED:
        zip64_values.append(header_offset)
    zip64 = struct.pack(f"<HH{len(zip64_values)}Q", _ZIP64_EXTRA_ID, 8 * len(zip64_values), *zip64_values) if zip64_values else b""
    unpadded = header_offset + _LOCAL_HEADER.size + len(name.encode("utf-8")) + len(zip64) + 4
    padding = -unpadded % alignment
    extra = zip64 + _PADDING_ID + struct.pack("<H", padding) + b"Z" * padding
    return RecordLayout(name, size, header_offset, unpadded + padding, extra)


def layout_records(names_and_sizes: Iterable[tuple[str, int]], start: int = 0) -> list[RecordLayout]:
    """Place records one after another from `start`, as torch's writer would.

    Args:
        names_and_sizes: (full member name, size) in writing order.
        start: Where the first local header goes.

    Returns:
        One layout per record; the central directory starts at the last one's `end`.
    """
    layouts = []
    cursor = start
    for name, size in names_and_sizes:
        layout = layout_record(name, size, cursor)
        layouts.append(layout)
        cursor = layout.end
    return layouts


def end_of_archive(layouts: list[RecordLayout], crcs: list[int]) -> bytes:
    """The central directory and end records that close an archive of these records.

    Args:
        layouts: Every record, in file order.
        crcs: Each record's CRC-32, in the same order.

    Returns:
        The bytes to write at the last record's `end`.
    """
    directory_offset = layouts[-1].end if layouts else 0
    directory = b"".join(layout.directory_entry(crc) for layout, crc in zip(layouts, crcs, strict=True))
    count = len(layouts)
    end64_offset = directory_offset + len(directory)
    end64 = _ZIP64_END_RECORD.pack(
        _ZIP64_END_MAGIC, _ZIP64_END_RECORD.size - 12, _ZIP64_MADE_BY, _ZIP64_NEEDED, 0, 0,
        count, count, len(directory), directory_offset,
    )
    locator = _ZIP64_LOCATOR.pack(_ZIP64_LOCATOR_MAGIC, 0, end64_offset, 1)
    end = _END_RECORD.pack(
        _END_MAGIC, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
        min(len(directory), _SATURATED), min(directory_offset, _SATURATED), 0,
    )
    return directory + end64 + locator + end


def new_serialization_id() -> str:
    """A fresh `.data/serialization_id`: 40 decimal digits, as torch's writer makes them."""
    import secrets

    return "".join(f"{secrets.randbits(64):020d}" for _ in range(2))


# ---------------------------------------------------------------------------
# CRC-32: of bytes, fast, and of a concatenation from the CRCs of its parts.

_fast_crc32: Any = None


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32 of `data`, continuing from `value`, as `zlib.crc32` computes it.

    ISA-L's carry-less-multiply CRC (the `isal` package) runs at tens of GB/s where
    zlib's table CRC runs near 2 GB/s, and a flattened checkpoint's every byte is
    summed once when it is verified. Both release the GIL on large buffers.
    """
    global _fast_crc32
    if _fast_crc32 is None:
        try:
            from isal import isal_zlib

            _fast_crc32 = isal_zlib.crc32
        except ImportError:  # a platform without its wheel: zlib gives the same values
            _fast_crc32 = zlib.crc32
    return int(_fast_crc32(data, value))


_CRC_POLY = 0xEDB88320


def _multiply(a: int, b: int) -> int:
    # a * b modulo the CRC-32 polynomial, bit-reflected (zlib's multmodp).
    product = 0
    mask = 1 << 31
    while True:
        if a & mask:
            product ^= b
            if a & (mask - 1) == 0:
                return product
        mask >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


@functools.cache
def _powers() -> list[int]:
    # x^1, then x^2, x^4, ...: x^(2^k) mod p
    powers = [1 << 30]
    for _ in range(31):
        powers.append(_multiply(powers[-1], powers[-1]))
    return powers


def _crc32_combine_python(first: int, second: int, second_length: int) -> int:
    # x^(8 * second_length) mod p, from the table of x^(2^k) (zlib's x2nmodp).
    powers = _powers()
    power = 1 << 31
    bit = 3
    length = second_length
    while length:
        if length & 1:
            power = _multiply(powers[bit & 31], power)
        length >>= 1
        bit += 1
    return _multiply(power, first) ^ second


def _zlib_combine() -> Any:
    # zlib's own crc32_combine64 through ctypes costs about 1 us a call, against
    # about 50 us for the same arithmetic in Python. The library is the one Python's
    # zlib module is linked against, looked up on first use (the readers never
    # need it) by its usual name; only where that fails is `find_library` asked,
    # which may run `ldconfig`.
    import ctypes

    def combine_in(library: str | None) -> Any:
        try:
            function = ctypes.CDLL(library).crc32_combine64
        except (OSError, AttributeError):
            return None
        function.argtypes = [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_int64]
        function.restype = ctypes.c_ulong
        return function

    function = combine_in("libz.so.1")
    if function is None:
        import ctypes.util

        name = ctypes.util.find_library("z")
        function = combine_in(name) if name else None
    return function or False


_combine_in_c: Any = None


def crc32_combine(first: int, second: int, second_length: int) -> int:
    """CRC-32 of A + B from CRC-32(A), CRC-32(B) and len(B), reading no bytes.

    Args:
        first: CRC-32 of the first part.
        second: CRC-32 of the second part.
        second_length: Length of the second part in bytes.

    Returns:
        CRC-32 of the concatenation, as `zlib.crc32(a + b)`.
    """
    global _combine_in_c
    if _combine_in_c is None:
        _combine_in_c = _zlib_combine()
    if _combine_in_c:
        return int(_combine_in_c(first, second, second_length)) & _SATURATED
    return _crc32_combine_python(first, second, second_length)
