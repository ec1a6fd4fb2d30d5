"""Checkpoints behind URLs and on the Hugging Face Hub, read from the few byte ranges that describe them.

What is fetched, by format (every step's ranges concurrently):
- safetensors: the first 64 bytes (the header length, and what detection reads),
  then the rest of the header;
- a torch.save zip: the first 64 bytes, the end record, the central directory,
  the fixed part of each record's local header (where its data starts, which is
  where torch maps it, so alignment is checked on real offsets) and data.pkl;
- a model directory (a Hub repository, or a URL to its index): config.json and
  the index, the first shard's header, then every other shard's header by one
  range sized on the first (and the remainder of any longer one).
Tensor bytes are fetched only when asked (`RemoteOptions.fetch_contents`, from
--deep); otherwise the rules that read them are skipped, and the report says so.

The file's size comes from the first ranged reply (its Content-Range), so no
HEAD request is spent on it. The report's note gives the bytes fetched and the
requests made beside the size.

Nothing remote is executed, whatever the caller's --trust: pickles go through the
restricted unpickler as on disk, and the formats that are code (TorchScript,
torch.export) or that need the whole file (legacy torch.save, tar, bare pickles)
are refused with a hint to download them.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import orjson

from memlayout.errors import CorruptCheckpointError, RemoteReadError, UnrecognizedFormatError
from memlayout.format_bytes import human_bytes
from memlayout.io.remote import RemoteFiles
from memlayout.io.zip_archive import LOCAL_HEADER_SIZE, ZipReader, archive_prefix
from memlayout.load import detect
from memlayout.load.file_source import StorageSpans, file_source, pickled_source
from memlayout.load.hf_ties import declared_ties
from memlayout.load.remote_hub import hub_headers, hub_target, hub_url_maker
from memlayout.load.remote_location import RemoteLocation, RemoteOptions

if TYPE_CHECKING:
    from memlayout.io.remote import RemoteFiles
    from memlayout.load.records import LoadedSource

HEAD_BYTES = 64
"""What is read first: the safetensors header length and what format detection reads."""
CONTENTS_SKIPPED = (
    "read remotely, and tensor contents are not fetched by default (pass --deep to fetch them by range)"
)


def load_remote(location: RemoteLocation, options: RemoteOptions) -> LoadedSource:
    """Read a remote checkpoint: one file, a model directory's index, or a Hub repository.

    Args:
        location: Where it is (`remote_location`).
        options: Timeout, full downloads, and whether tensor bytes are fetched.

    Returns:
        The source, named as the user gave it, with a note of what the reads cost.

    Raises:
        RemoteReadError: the server, the network or the reply failed; one line with a hint.
        CorruptCheckpointError, UnrecognizedFormatError: as for a local file.
    """
    headers: dict[str, str] = {}
    if location.protocol == "hf":
        url, listing = hub_target(location, options)
        protocol = url.partition("://")[0]
        headers = hub_headers()
    else:
        url, listing, protocol = location.url, None, location.protocol
    files = RemoteFiles(protocol, timeout_s=options.timeout_s, headers=headers, download=options.download)
    if listing is not None:
        source = _load_directory(location.given, url, listing, files, options, config_listed=True)
    elif url.endswith(".index.json"):
        # A URL to an index: the model's folder is where the index lies, config.json beside it.
        base = url.rsplit("/", 1)[0] + "/"
        source = _load_directory(location.given, base, [url.rsplit("/", 1)[1]], files, options, config_listed=False)
    else:
        source = _load_file(url, files, options)
        source.path = location.given
    source.notes.append(remote_note(files))
    return source


def remote_note(files: RemoteFiles) -> str:
    """What the reads cost beside what the files hold: "read remotely: 1.2 KiB fetched in 2 requests, of 5.0 MiB (1 file)"."""
    tally = files.tally
    count = len(tally.sizes)
    return (
        f"read remotely: {human_bytes(tally.bytes_fetched)} fetched in {tally.requests} "
        f"request{'s' if tally.requests != 1 else ''}, of {human_bytes(sum(tally.sizes.values()))} "
        f"({count} file{'s' if count != 1 else ''}); not checked remotely: whether a file is also valid as "
        "another container format (ML603 reads its other ends)"
    )


# -- one file ---------------------------------------------------------------------


def _load_file(url: str, files: RemoteFiles, options: RemoteOptions) -> LoadedSource:
    head = files.read(url, 0, HEAD_BYTES)
    if not head:
        raise CorruptCheckpointError(f"{url} is empty", "the file holds no bytes; re-export it")
    if detect.looks_like_safetensors(head):
        return _load_safetensors(url, head, files, options)
    if detect.is_zip(url, head):
        return _load_torch_zip(url, files, options)
    from memlayout.load.legacy import is_legacy_torch

    if is_legacy_torch(url, head) or head[:1] == b"\x80":
        raise UnrecognizedFormatError(
            f"{url} is a legacy torch.save file or a bare pickle, which memlayout reads from local files only",
            "download it and inspect the local copy; its storages are not located without reading it all",
        )
    raise UnrecognizedFormatError(f"{url} is not a checkpoint format memlayout reads remotely")


def _header_length(url: str, head: bytes) -> int:
    from memlayout.load.safetensors_file import HEADER_LENGTH_BYTES, MAX_HEADER_BYTES

    (length,) = struct.unpack("<Q", head[:HEADER_LENGTH_BYTES])
    if length > MAX_HEADER_BYTES:
        raise CorruptCheckpointError(f"{url}: invalid safetensors header: it claims {length} bytes")
    return int(length)


def _load_safetensors(url: str, head: bytes, files: RemoteFiles, options: RemoteOptions) -> LoadedSource:
    from memlayout.load.safetensors_file import (
        HEADER_LENGTH_BYTES,
        metadata_ties,
        parse_header,
        safetensors_records,
    )

    end = min(HEADER_LENGTH_BYTES + _header_length(url, head), files.size(url))
    raw = head + files.read(url, len(head), end) if end > len(head) else head
    header = parse_header(url, raw, files.size(url))
    tensors, storages, spans = safetensors_records(header)
    notes = []
    if header.metadata:
        shown = ", ".join(f"{k}={v[:40]}" for k, v in sorted(header.metadata.items())[:5])
        notes.append(f"safetensors __metadata__: {shown}")
    source = file_source(
        url, "safetensors", tensors, storages, spans, declared_ties=metadata_ties(header), notes=notes,
        read_in_place=False,
    )
    _attach_reader(source, files, [url], spans.starts, spans.sizes, None, options)
    return source


def _load_torch_zip(url: str, files: RemoteFiles, options: RemoteOptions) -> LoadedSource:
    from memlayout.load.restricted_pickle import unpickle

    size = files.size(url)
    ranges = _RangeCache(files, url)
    # Each local header is fetched alone (header_block 0), after all are fetched at once below.
    reader = ZipReader(-1, size, 0, url, read_at=ranges.read_at, header_block=0)
    names = reader.names
    if any(name.endswith(("/constants.pkl", "/archive_format")) or "/code/" in name for name in names):
        raise UnrecognizedFormatError(
            f"{url} is a TorchScript or torch.export archive, which memlayout reads from local files only",
            "download it and inspect the local copy",
        )
    try:
        prefix = archive_prefix(names)
        ranges.prefetch([
            (entry.header_offset, LOCAL_HEADER_SIZE)
            for entry in reader.entries
            if entry.name.startswith(f"{prefix}data/") or entry.name == f"{prefix}data.pkl"
        ])
        pickle_entry = reader.entry(f"{prefix}data.pkl")
        start = reader.data_start(pickle_entry)
        ranges.prefetch([(start, pickle_entry.compressed_size)])
        pickle_bytes = reader.read(f"{prefix}data.pkl")
        starts, sizes, checksums = reader.record_spans(f"{prefix}data/")
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{url}: {exc.message}", exc.hint) from exc
    result = unpickle(pickle_bytes, what=f"{url}: the pickle {prefix}data.pkl")
    source = pickled_source(
        url, "torch-zip", result.root, StorageSpans(starts, sizes, checksums),
        pickle_globals=result.globals, made_placeholders=result.made_placeholders, read_in_place=False,
    )
    _attach_reader(source, files, [url], starts, sizes, None, options)
    return source


class _RangeCache:
    """A zip reader's reads, served from ranges fetched beforehand where it can."""

    def __init__(self, files: RemoteFiles, url: str) -> None:
        self.files = files
        self.url = url
        self.cached: dict[tuple[int, int], bytes] = {}

    def prefetch(self, spans: list[tuple[int, int]]) -> None:
        """Fetch (offset, length) spans concurrently, for the reads that follow."""
        todo = [span for span in spans if span not in self.cached]
        found = self.files.read_ranges([(self.url, offset, offset + length) for offset, length in todo])
        self.cached.update(zip(todo, found, strict=True))

    def read_at(self, length: int, offset: int) -> bytes:
        found = self.cached.get((offset, length))
        if found is None:
            found = self.cached[(offset, length)] = self.files.read(self.url, offset, offset + length)
        return found


# -- tensor bytes ---------------------------------------------------------------------


class RemoteStorageReader:
    """Storage bytes fetched by range, for --deep on a remote source."""

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
        return self.files.read(url, begin, begin + length)


def _attach_reader(
    source: LoadedSource, files: RemoteFiles, urls: list[str], starts: dict[str, int], sizes: dict[str, int],
    file_of: dict[str, int] | None, options: RemoteOptions,
) -> None:
    if options.fetch_contents:
        source.reader = RemoteStorageReader(files, urls, starts, sizes, file_of)
    else:
        source.reader = None
        source.content_unreadable = CONTENTS_SKIPPED


# -- model directories ------------------------------------------------------------


def _load_directory(
    given: str, base: str, listing: list[str], files: RemoteFiles, options: RemoteOptions, config_listed: bool
) -> LoadedSource:
    from memlayout.load.hf_dir import (
        BIN_INDEX,
        BIN_SINGLE,
        CONFIG,
        SAFETENSORS_INDEX,
        SAFETENSORS_SINGLE,
        index_shards,
    )

    present = set(listing)
    config = None
    if CONFIG in present or not config_listed:
        config = _read_json_or_none(files, base + CONFIG)
    if SAFETENSORS_INDEX in present or BIN_INDEX in present:
        index_name = SAFETENSORS_INDEX if SAFETENSORS_INDEX in present else BIN_INDEX
        index_url = base + index_name
        shards = list(index_shards(_json(files, index_url, "index"), index_url))
        pickled = index_name == BIN_INDEX
    elif any(name.endswith(".index.json") for name in listing):
        index_url = base + listing[0]
        shards = list(index_shards(_json(files, index_url, "index"), index_url))
        pickled = not all(shard.endswith(".safetensors") for shard in shards)
    elif SAFETENSORS_SINGLE in present:
        shards, pickled = [SAFETENSORS_SINGLE], False
    elif BIN_SINGLE in present:
        shards, pickled = [BIN_SINGLE], True
    else:
        raise UnrecognizedFormatError(
            f"{given} has none of {SAFETENSORS_INDEX}, {SAFETENSORS_SINGLE}, {BIN_INDEX}, {BIN_SINGLE}"
        )
    urls = [base + shard for shard in shards]
    if pickled:
        source = _pickled_shards(given, shards, urls, files, options)
    else:
        source = _safetensors_shards(given, shards, urls, files, options)
    if isinstance(config, dict):
        source.declared_ties += declared_ties(config, [t.name for t in source.tensors])
    elif config is None:
        source.notes.append(f"{given} has no {CONFIG}: no tie intent is known")
    return source


def _safetensors_shards(
    given: str, shards: list[str], urls: list[str], files: RemoteFiles, options: RemoteOptions
) -> LoadedSource:
    from memlayout.load.hf_dir import safetensors_shards_source
    from memlayout.load.safetensors_file import parse_header

    # The shards of one model have headers of nearly one length. The first shard's
    # length is read first; every other shard is then asked for that many bytes and
    # a thirty-second more, so that most shards cost one request and a few bytes of
    # overshoot, and the rare longer header one more request for its remainder.
    first = files.read(urls[0], 0, HEAD_BYTES)
    ends = [_shard_header_end(urls[0], first, files)]
    guess = ends[0] + ends[0] // 32
    asked = [(urls[0], len(first), ends[0])] + [(url, 0, guess) for url in urls[1:]]
    got = files.read_ranges(asked)
    raws = [first + got[0], *got[1:]]
    for url, raw in zip(urls[1:], raws[1:], strict=True):
        ends.append(_shard_header_end(url, raw, files))
    short = [(i, (urls[i], len(raws[i]), ends[i])) for i in range(len(urls)) if ends[i] > len(raws[i])]
    for (i, _), rest in zip(short, files.read_ranges([r for _, r in short]), strict=True):
        raws[i] += rest
    headers = [
        parse_header(url, raw[:end], files.size(url)) for url, raw, end in zip(urls, raws, ends, strict=True)
    ]
    source, spans = safetensors_shards_source(given, shards, headers, urls, read_in_place=False)
    _attach_reader(source, files, urls, spans.starts, spans.sizes, spans.file_of, options)
    return source


def _shard_header_end(url: str, head: bytes, files: RemoteFiles) -> int:
    """Where a shard's header ends, from its first bytes; the shard must be safetensors."""
    if not detect.looks_like_safetensors(head[:HEAD_BYTES]):
        raise CorruptCheckpointError(f"{url} is no safetensors file, though the index names it as a shard")
    return min(detect.SAFETENSORS_HEADER_LENGTH_BYTES + _header_length(url, head), files.size(url))


def _pickled_shards(
    given: str, shards: list[str], urls: list[str], files: RemoteFiles, options: RemoteOptions
) -> LoadedSource:
    from memlayout.load.hf_dir import pickled_shards_source

    by_name = dict(zip(shards, urls, strict=True))
    source = pickled_shards_source(given, shards, lambda shard: _load_file(by_name[shard], files, options))
    if not options.fetch_contents:
        source.reader = None
        source.content_unreadable = CONTENTS_SKIPPED
    return source


def _json(files: RemoteFiles, url: str, what: str) -> Any:
    try:
        return orjson.loads(files.read_whole(url))
    except ValueError as exc:
        raise CorruptCheckpointError(f"{url}: the {what} is not readable JSON ({exc})") from exc


def _read_json_or_none(files: RemoteFiles, url: str) -> Any:
    try:
        return _json(files, url, "model config")
    except RemoteReadError as exc:
        if "not found" in exc.message:
            return None
        raise


def fetch_remote_config(location: RemoteLocation, options: RemoteOptions) -> tuple[str, bytes]:
    """A remote model's config.json, alone: for `memlayout activations`, which builds from it.

    Args:
        location: A URL of the config.json or of its folder, or a Hub repository (or a folder in it).
        options: The timeout.

    Returns:
        (the config's URL, its bytes).
    """
    from memlayout.load.hf_dir import CONFIG

    headers: dict[str, str] = {}
    if location.protocol == "hf":
        hf_hub_url = hub_url_maker(location)
        path = location.path_in_repo or CONFIG
        if not path.endswith(".json"):
            path = f"{path.rstrip('/')}/{CONFIG}"
        url = hf_hub_url(location.repo, path, revision=location.revision)
        headers = hub_headers()
    else:
        url = location.url if location.url.endswith(".json") else f"{location.url.rstrip('/')}/{CONFIG}"
    files = RemoteFiles(url.partition("://")[0], timeout_s=options.timeout_s, headers=headers)
    return url, files.read_whole(url)
