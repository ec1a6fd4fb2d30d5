"""torch.save zip archives, read without torch and without executing the pickle.

The archive holds `<archive>/data.pkl` and one uncompressed record per storage,
`<archive>/data/<key>`, aligned to 64 bytes. Tensor metadata comes from the pickle
through the restricted unpickler; storage bytes are read in place from the file.

The zip directory is parsed here with `struct` over bytes read with pread, rather
than with `zipfile`: `zipfile.ZipFile` builds a `ZipInfo` object per entry (decoding
extra fields, timestamps and flags nobody here reads) and seeks and reads the file
for each, which made it the largest single cost of listing a 400-tensor
checkpoint. A checkpoint needs only a few fields per entry, and torch always stores
records uncompressed, so the directory walk is one `unpack_from` per entry plus one
30-byte pread per storage for its local header.

The archive may be a window of a larger file (`read_torch_zip`): torch.export's
older `.pt2` layout stores whole torch.save archives, uncompressed, as members of
its own zip. Offsets inside the archive count from the window's start, and the
storage offsets handed back are absolute in the file, so one memory map of the
outer file serves the nested storages.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import NamedTuple

from memlayout.errors import CorruptCheckpointError
from memlayout.load.file_source import StorageSpans, pickled_source
from memlayout.load.records import LoadedSource
from memlayout.load.restricted_pickle import UnpickleResult, unpickle

# Fixed-size parts of the zip records (APPNOTE.TXT 4.3.7, 4.3.12, 4.3.14-16).
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_HEADER_MAGIC = b"PK\x03\x04"
_LOCAL_LENGTHS = struct.Struct("<4s22xHH")
"""A local header's magic and its file name and extra field lengths."""
_CENTRAL_ENTRY = struct.Struct("<4sHHHHHHIIIHHHHHII")
_CENTRAL_MAGIC = b"PK\x01\x02"
_END_RECORD = struct.Struct("<4sHHHHIIH")
_END_MAGIC = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_LOCATOR_MAGIC = b"PK\x06\x07"
_ZIP64_END_RECORD = struct.Struct("<4sQHHIIQQQQ")
_ZIP64_END_MAGIC = b"PK\x06\x06"
_ZIP64_EXTRA_ID = 0x0001
_STORED, _DEFLATED = 0, 8
# The end record sits within its own size plus the longest possible comment.
_END_SEARCH = _END_RECORD.size + 0xFFFF



class ZipEntry(NamedTuple):
    """What memlayout needs of one zip directory entry (a NamedTuple: built 400 times per listing)."""

    name: str
    method: int
    compressed_size: int
    size: int
    header_offset: int
    crc: int


def archive_prefix(names: list[str]) -> str:
    """The archive's top folder: the one holding data.pkl."""
    for name in names:
        if name.endswith("/data.pkl") and name.count("/") == 1:
            return name[: -len("data.pkl")]
    raise CorruptCheckpointError("the zip has no <archive>/data.pkl: it is not a torch.save file")


class _File:
    """pread access to the archive for reading its directory and headers.

    Metadata never goes through the memory map: touching one byte of a map maps the
    whole page-cache folio behind it, so reading the 400 local headers of a 4 GiB
    checkpoint through the map cost 3.3 ms and made closing it slow, against 0.24 ms
    with pread, whatever the file size.

    The archive is bytes `base .. base + size` of the file, and offsets given to
    `read` count from `base`. Every offset read from the zip is checked against
    `size` before its data is used.
    """

    def __init__(self, fd: int, size: int, base: int = 0) -> None:
        self.fd = fd
        self.size = size
        self.base = base

    def read(self, offset: int, length: int, what: str) -> bytes:
        data = os.pread(self.fd, length, self.base + offset) if offset >= 0 else b""
        if len(data) != length:
            raise CorruptCheckpointError(f"{what} runs past the end of the file (a truncated file?)")
        return data


def _end_of_directory(file: _File) -> tuple[int, int, int]:
    """(entry count, directory offset, directory size) from the end records."""
    tail_start = max(0, file.size - _END_SEARCH - _ZIP64_LOCATOR.size)
    tail = file.read(tail_start, file.size - tail_start, "the zip's end record")
    at = tail.rfind(_END_MAGIC)
    if at < 0 or at + _END_RECORD.size > len(tail):
        raise CorruptCheckpointError("the zip's end-of-directory record is missing (a truncated file?)")
    _, _, _, _, count, directory_size, directory_offset, _ = _END_RECORD.unpack_from(tail, at)
    locator_at = at - _ZIP64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at : locator_at + 4] == _ZIP64_LOCATOR_MAGIC:
        # Archives over 4 GiB (or 65535 entries) keep the real values in the zip64 end record.
        _, _, end64_at, _ = _ZIP64_LOCATOR.unpack_from(tail, locator_at)
        end64 = file.read(end64_at, _ZIP64_END_RECORD.size, "the zip64 end record")
        if end64[:4] != _ZIP64_END_MAGIC:
            raise CorruptCheckpointError("the zip64 end-of-directory record is damaged")
        fields = _ZIP64_END_RECORD.unpack(end64)
        count, directory_size, directory_offset = fields[7], fields[8], fields[9]
    if directory_offset + directory_size > file.size:
        raise CorruptCheckpointError("the zip directory lies past the end of the file (a truncated file?)")
    return count, directory_offset, directory_size


def _zip64_values(extra: bytes, wanted: list[int]) -> list[int]:
    # The zip64 extra field holds, in order, only those of (size, compressed size,
    # header offset) whose 32-bit field was saturated at 0xFFFFFFFF.
    at = 0
    while at + 4 <= len(extra):
        header_id, length = struct.unpack_from("<HH", extra, at)
        if header_id == _ZIP64_EXTRA_ID:
            values = list(struct.unpack_from(f"<{len(wanted)}Q", extra, at + 4)) if length >= 8 * len(wanted) else []
            if len(values) == len(wanted):
                return values
            break
        at += 4 + length
    raise CorruptCheckpointError("a zip entry over 4 GiB lacks its zip64 sizes")


def read_directory(file: _File) -> list[ZipEntry]:
    """Every entry of the zip's central directory.

    Raises:
        CorruptCheckpointError: the file is no zip, or its directory is damaged.
    """
    count, directory_offset, directory_size = _end_of_directory(file)
    directory = file.read(directory_offset, directory_size, "the zip directory")
    entries = []
    unpack = _CENTRAL_ENTRY.unpack_from
    fixed = _CENTRAL_ENTRY.size
    at = 0
    for _ in range(count):
        if at + fixed > directory_size:
            raise CorruptCheckpointError("the zip directory ends before its last entry")
        (magic, _, _, flags, method, _, _, crc, compressed, size, name_length, extra_length, comment_length,
         _, _, _, offset) = unpack(directory, at)
        if magic != _CENTRAL_MAGIC:
            raise CorruptCheckpointError("the zip directory is damaged")
        name_end = at + fixed + name_length
        # Bit 11 marks UTF-8 names; torch writes ASCII, other writers may use cp437.
        name = directory[at + fixed : name_end].decode("utf-8" if flags & 0x800 else "cp437")
        if compressed == 0xFFFFFFFF or size == 0xFFFFFFFF or offset == 0xFFFFFFFF:
            saturated = [value for value in (size, compressed, offset) if value == 0xFFFFFFFF]
            values = iter(_zip64_values(directory[name_end : name_end + extra_length], saturated))
            size = next(values) if size == 0xFFFFFFFF else size
            compressed = next(values) if compressed == 0xFFFFFFFF else compressed
            offset = next(values) if offset == 0xFFFFFFFF else offset
        entries.append(ZipEntry(name, method, compressed, size, offset, crc))
        at = name_end + extra_length + comment_length
    return entries


def _data_start(file: _File, entry: ZipEntry) -> int:
    # The local header's extra field differs from the directory's (torch pads it to
    # align the data to 64 bytes), so the data offset must come from the local header.
    magic, name_length, extra_length = _LOCAL_LENGTHS.unpack(
        file.read(entry.header_offset, _LOCAL_HEADER.size, f"the zip entry {entry.name}")
    )
    if magic != _LOCAL_HEADER_MAGIC:
        raise CorruptCheckpointError(f"the zip entry for {entry.name} is damaged")
    start: int = entry.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if start + entry.compressed_size > file.size:
        raise CorruptCheckpointError(f"the zip entry {entry.name} runs past the end of the file")
    return start


def _read_pickle(file: _File, entry: ZipEntry) -> bytes:
    data = file.read(_data_start(file, entry), entry.compressed_size, entry.name)
    if entry.method == _DEFLATED:
        try:
            data = zlib.decompress(data, -15)
        except zlib.error as exc:
            raise CorruptCheckpointError(f"{entry.name} cannot be decompressed: {exc}") from exc
    elif entry.method != _STORED:
        raise CorruptCheckpointError(f"{entry.name} uses zip compression method {entry.method}, which torch never writes")
    if len(data) != entry.size or zlib.crc32(data) != entry.crc:
        raise CorruptCheckpointError(f"{entry.name} fails its zip checksum; the file is damaged")
    return data


def _record_offsets(
    file: _File, entries: list[ZipEntry], prefix: str
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(absolute data start, size, CRC-32) of every storage record, by storage key."""
    data_prefix = f"{prefix}data/"
    skip = len(data_prefix)
    starts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    checksums: dict[str, int] = {}
    # _data_start inlined: this loop runs once per storage and is most of a listing's
    # zip cost, so it keeps to one pread and one unpack per record.
    pread, unpack, fd, header_size = os.pread, _LOCAL_LENGTHS.unpack, file.fd, _LOCAL_HEADER.size
    # Zip offsets count from the window's start; a header past the window's end
    # yields a data start past it too, which the bounds check below refuses.
    base = file.base
    end = base + file.size
    for name, method, _, size, header_offset, crc in entries:
        if not name.startswith(data_prefix) or name.endswith("/"):
            continue
        if method != _STORED:
            raise CorruptCheckpointError(f"storage record {name} is compressed; torch.save never does that")
        header = pread(fd, header_size, base + header_offset)
        if len(header) != header_size:
            raise CorruptCheckpointError(f"the zip entry {name} runs past the end of the file (a truncated file?)")
        magic, name_length, extra_length = unpack(header)
        start = base + header_offset + header_size + name_length + extra_length
        if magic != _LOCAL_HEADER_MAGIC or start + size > end:
            raise CorruptCheckpointError(f"the zip entry for {name} is damaged")
        key = name[skip:]
        starts[key] = start
        sizes[key] = size
        checksums[key] = crc
    return starts, sizes, checksums


class TorchZipArchive(NamedTuple):
    """A torch.save archive's pickle, unpickled inertly, and where its storage records lie."""

    prefix: str
    """The archive's top folder, e.g. "archive/"."""
    pickle: UnpickleResult
    starts: dict[str, int]
    """Absolute offset in the file of each storage record's byte 0, by storage key."""
    sizes: dict[str, int]
    checksums: dict[str, int]
    """The CRC-32 the zip records for each storage record."""


def read_torch_zip(fd: int, base: int, size: int, what: str) -> TorchZipArchive:
    """Read the torch.save archive in bytes `base .. base + size` of an open file.

    Args:
        fd: The file, open for reading.
        base: Where the archive starts in the file (0 for a torch.save file itself).
        size: The archive's length in bytes.
        what: The archive as error messages name it, e.g. the path.

    Returns:
        The inert pickle tree and the storage records' absolute spans.

    Raises:
        CorruptCheckpointError: the zip or the pickle inside is damaged.
    """
    file = _File(fd, size, base)
    try:
        entries = read_directory(file)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(f"{what} is not a readable zip archive: {exc}") from exc
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{what} is not a readable zip archive: {exc.message}", exc.hint) from exc
    by_name = {entry.name: entry for entry in entries}
    try:
        prefix = archive_prefix(list(by_name))
        pickle_bytes = _read_pickle(file, by_name[f"{prefix}data.pkl"])
        starts, sizes, checksums = _record_offsets(file, entries, prefix)
    except CorruptCheckpointError as exc:
        # Name the file: in a sharded directory the user cannot tell which shard it is.
        raise CorruptCheckpointError(f"{what}: {exc.message}", exc.hint) from exc
    result = unpickle(pickle_bytes, what=f"{what}: the pickle {prefix}data.pkl")
    return TorchZipArchive(prefix, result, starts, sizes, checksums)


def load_torch_zip(path: str) -> LoadedSource:
    """Read a torch.save zip archive as metadata, without executing its pickle.

    Args:
        path: The .pt / .pth / .bin file.

    Returns:
        A `LoadedSource` whose reader maps storage bytes from the file.

    Raises:
        CorruptCheckpointError: the zip or the pickle inside is damaged.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise CorruptCheckpointError(f"{path} is empty")
        archive = read_torch_zip(fd, 0, size, path)
    finally:
        os.close(fd)
    result = archive.pickle
    return pickled_source(
        path, "torch-zip", result.root, StorageSpans(archive.starts, archive.sizes, archive.checksums),
        pickle_globals=result.globals, made_placeholders=result.made_placeholders,
    )
