"""Laying records out exactly as torch's writer (caffe2/serialize/inline_container.cc) does."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from memlayout.io.zip_archive.records import (
    CENTRAL_ENTRY,
    CENTRAL_MAGIC,
    DESCRIPTOR_32,
    DESCRIPTOR_64,
    DESCRIPTOR_MAGIC,
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


def torch_archive_name(path: str) -> str:
    """The top folder torch.save gives an archive written to `path`.

    torch's writer names it after the file, without folders or extension
    (`out/model.pt` -> "model"); a name with nothing left (".pt") gets "archive",
    as torch names archives written to a buffer.
    """
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    stem = base[: base.rfind(".")] if "." in base else base
    return stem or "archive"


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
        return self.size >= SATURATED or self.header_offset >= SATURATED

    @property
    def end(self) -> int:
        """Where the next record's local header starts (after the data descriptor)."""
        return self.data_offset + self.size + self.descriptor_size

    @property
    def descriptor_size(self) -> int:
        if self.size == 0:
            return 0
        return DESCRIPTOR_64.size if self.zip64 else DESCRIPTOR_32.size

    @property
    def flags(self) -> int:
        return _UTF8 | _DESCRIPTOR_FOLLOWS if self.size else _UTF8

    def local_header(self) -> bytes:
        """The local header and its extra field, ready to write at `header_offset`."""
        encoded = self.name.encode("utf-8")
        fixed = LOCAL_HEADER.pack(
            LOCAL_HEADER_MAGIC, 0, self.flags, STORED, 0, 0, 0, 0, 0, len(encoded), len(self.extra)
        )
        return fixed + encoded + self.extra

    def descriptor(self, crc: int) -> bytes:
        """The data descriptor that follows the data (nothing for an empty record)."""
        if self.size == 0:
            return b""
        if self.zip64:
            return DESCRIPTOR_64.pack(DESCRIPTOR_MAGIC, crc, self.size, self.size)
        return DESCRIPTOR_32.pack(DESCRIPTOR_MAGIC, crc, self.size, self.size)

    def directory_entry(self, crc: int) -> bytes:
        """This record's central directory entry."""
        encoded = self.name.encode("utf-8")
        size = min(self.size, SATURATED)
        offset = min(self.header_offset, SATURATED)
        values = ([self.size, self.size] if self.size >= SATURATED else []) + (
            [self.header_offset] if self.header_offset >= SATURATED else []
        )
        extra = struct.pack(f"<HH{len(values)}Q", ZIP64_EXTRA_ID, 8 * len(values), *values) if values else b""
        fixed = CENTRAL_ENTRY.pack(
            CENTRAL_MAGIC, 0, 0, self.flags, STORED, 0, 0, crc, size, size,
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
    if size >= SATURATED:
        # miniz builds the local zip64 block before it knows the compressed size.
        zip64_values += [size, 0]
    if header_offset >= SATURATED:
        zip64_values.append(header_offset)
    zip64 = (struct.pack(f"<HH{len(zip64_values)}Q", ZIP64_EXTRA_ID, 8 * len(zip64_values), *zip64_values)
             if zip64_values else b"")
    unpadded = header_offset + LOCAL_HEADER.size + len(name.encode("utf-8")) + len(zip64) + 4
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
    end64 = ZIP64_END_RECORD.pack(
        ZIP64_END_MAGIC, ZIP64_END_RECORD.size - 12, _ZIP64_MADE_BY, _ZIP64_NEEDED, 0, 0,
        count, count, len(directory), directory_offset,
    )
    locator = ZIP64_LOCATOR.pack(ZIP64_LOCATOR_MAGIC, 0, end64_offset, 1)
    end = END_RECORD.pack(
        END_MAGIC, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
        min(len(directory), SATURATED), min(directory_offset, SATURATED), 0,
    )
    return directory + end64 + locator + end


def new_serialization_id() -> str:
    """A fresh `.data/serialization_id`: 40 decimal digits, as torch's writer makes them."""
    import secrets

    return "".join(f"{secrets.randbits(64):020d}" for _ in range(2))
