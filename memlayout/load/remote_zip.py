"""torch.save zips behind URLs, several at once, in three rounds of requests; and tensor bytes for --deep.

A zip is read from its end: the end records say where the central directory
lies, the directory says where each record's local header lies, and each local
header says where the record's bytes start (torch pads it so they are 64-byte
aligned, which ML2xx checks on the real offsets). Over a network each of those
is a round trip, so:
1. the first 64 bytes (what detection reads) and the last `ZIP_TAIL_BYTES`
   (the end record, zip64's locator and end record, as torch writes them) go in
   one request;
2. the central directory, which they locate;
3. every storage record's 30-byte local header and data.pkl (with its local
   header, whose padding is at most 67 bytes) go in one request, as many ranges
   of one file (`multipart/byteranges`) where the server allows it.
The shards of a sharded `.bin` model take these rounds together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memlayout.errors import CorruptCheckpointError, UnrecognizedFormatError
from memlayout.io.zip_archive import LOCAL_HEADER_SIZE, ZipReader, archive_prefix
from memlayout.io.zip_archive.records import END_RECORD, ZIP64_END_RECORD, ZIP64_LOCATOR
from memlayout.load.file_source import StorageSpans, pickled_source

if TYPE_CHECKING:
    from memlayout.io.remote import RemoteFiles
    from memlayout.load.records import LoadedSource
    from memlayout.load.remote_location import RemoteOptions

HEAD_BYTES = 64
"""What is read first: the safetensors header length and what format detection reads."""
ZIP_TAIL_BYTES = END_RECORD.size + ZIP64_LOCATOR.size + ZIP64_END_RECORD.size
"""A zip's end, read with its head: its end records, 98 bytes as torch writes them (no comment, zip64 always).

A longer guess would hold the directory of a small checkpoint too, but also the
last tensor's bytes, which a metadata read never fetches."""
TORCH_MAX_PADDING = 4 + 63
"""The most a torch local header's extra field holds: a 4-byte field header and padding to 64 bytes."""
CONTENTS_SKIPPED = (
    "read remotely, and tensor contents are not fetched by default (pass --deep to fetch them by range)"
)


def first_reads(url: str, files: RemoteFiles) -> list[tuple[str, int, int]]:
    """The ranges a file's reading starts with: its head, and for a name that is not safetensors its end too.

    The name only decides what is fetched early, never how the bytes are read:
    a zip named `.safetensors` still reads as a zip, one round later.
    """
    reads = [(url, 0, HEAD_BYTES)]
    if not url.rpartition("/")[2].lower().endswith(".safetensors"):
        reads.append((url, -ZIP_TAIL_BYTES, 0))
    return reads


def torch_zip_sources(urls: list[str], files: RemoteFiles, options: RemoteOptions) -> list[LoadedSource]:
    """Each URL's torch.save zip as a source; their rounds of requests are shared.

    Raises:
        UnrecognizedFormatError: a file is TorchScript or torch.export, read from local files only.
        CorruptCheckpointError: a file is damaged.
    """
    from memlayout.load.restricted_pickle import unpickle

    files.read_ranges([read for url in urls for read in first_reads(url, files)])
    readers = [_reader(url, files) for url in urls]
    wanted = []
    for url, (reader, prefix) in zip(urls, readers, strict=True):
        pickle_entry = reader.entry(f"{prefix}data.pkl")
        pickle_end = (pickle_entry.header_offset + LOCAL_HEADER_SIZE + len(pickle_entry.name.encode())
                      + TORCH_MAX_PADDING + pickle_entry.compressed_size)
        wanted.append((url, pickle_entry.header_offset, min(pickle_end, reader.file.size)))
        wanted += [
            (url, entry.header_offset, entry.header_offset + LOCAL_HEADER_SIZE)
            for entry in reader.entries if entry.name.startswith(f"{prefix}data/")
        ]
    files.read_ranges(wanted)
    sources = []
    for url, (reader, prefix) in zip(urls, readers, strict=True):
        try:
            pickle_bytes = reader.read(f"{prefix}data.pkl")
            starts, sizes, checksums = reader.record_spans(f"{prefix}data/")
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{url}: {exc.message}", exc.hint) from exc
        result = unpickle(pickle_bytes, what=f"{url}: the pickle {prefix}data.pkl")
        source = pickled_source(
            url, "torch-zip", result.root, StorageSpans(starts, sizes, checksums),
            pickle_globals=result.globals, made_placeholders=result.made_placeholders, read_in_place=False,
        )
        attach_reader(source, files, [url], starts, sizes, None, options)
        sources.append(source)
    return sources


def _reader(url: str, files: RemoteFiles) -> tuple[ZipReader, str]:
    size = files.size(url)

    def read_at(length: int, offset: int) -> bytes:
        return files.read(url, offset, offset + length)

    # Each local header is read alone (header_block 0): they were all fetched at once beforehand.
    reader = ZipReader(-1, size, 0, url, read_at=read_at, header_block=0)
    names = reader.names
    if any(name.endswith(("/constants.pkl", "/archive_format")) or "/code/" in name for name in names):
        raise UnrecognizedFormatError(
            f"{url} is a TorchScript or torch.export archive, which memlayout reads from local files only",
            "download it and inspect the local copy",
        )
    try:
        prefix = archive_prefix(names)
        reader.entry(f"{prefix}data.pkl")
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{url}: {exc.message}", exc.hint) from exc
    return reader, prefix


# -- tensor bytes ---------------------------------------------------------------------


class RemoteStorageReader:
    """Storage bytes fetched by range, for --deep on a remote source; closing it ends the source's transport."""

    def __init__(
        self, files: RemoteFiles, urls: list[str], starts: dict[str, int], sizes: dict[str, int],
        file_of: dict[str, int] | None,
    ) -> None:
        self.files = files
        self.urls = urls
        self.starts = starts
        self.sizes = sizes
        self.file_of = file_of

    def read(self, storage_key: str, start: int, length: int) -> bytes:
        """Return `length` bytes of storage `storage_key` from byte `start`, fetched by one range."""
        size = self.sizes[storage_key]
        if start < 0 or length < 0 or start + length > size:
            raise CorruptCheckpointError(
                f"storage {storage_key} is {size} bytes, but a tensor reads bytes {start}..{start + length}"
            )
        url = self.urls[self.file_of[storage_key] if self.file_of is not None else 0]
        begin = self.starts[storage_key] + start
        return self.files.read(url, begin, begin + length, keep=False)

    def close(self) -> None:
        self.files.close()


def attach_reader(
    source: LoadedSource, files: RemoteFiles, urls: list[str], starts: dict[str, int], sizes: dict[str, int],
    file_of: dict[str, int] | None, options: RemoteOptions,
) -> None:
    """Tensor bytes by range for --deep; otherwise none, and the content rules are skipped with the reason."""
    if options.fetch_contents:
        source.reader = RemoteStorageReader(files, urls, starts, sizes, file_of)
    else:
        source.reader = None
        source.content_unreadable = CONTENTS_SKIPPED
