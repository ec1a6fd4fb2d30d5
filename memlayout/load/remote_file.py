"""One remote file, recognized by its first bytes: safetensors, or a torch.save zip (`remote_zip`).

The formats that are code (TorchScript, torch.export) or that need the whole file
(legacy torch.save, tar, bare pickles) are refused with a hint to download them,
and a web page where a checkpoint was expected (a folder's listing) says so.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from memlayout.errors import CorruptCheckpointError, UnrecognizedFormatError
from memlayout.load import detect
from memlayout.load.file_source import file_source
from memlayout.load.remote_zip import HEAD_BYTES, attach_reader, first_reads, torch_zip_sources

if TYPE_CHECKING:
    from memlayout.io.remote import RemoteFiles
    from memlayout.load.records import LoadedSource
    from memlayout.load.remote_location import RemoteOptions


def load_file(url: str, files: RemoteFiles, options: RemoteOptions) -> LoadedSource:
    """One remote file, detected by its first bytes (what `first_reads` fetched, when a caller asked early)."""
    files.read_ranges(first_reads(url, files))
    head = files.read(url, 0, HEAD_BYTES)
    if not head:
        raise CorruptCheckpointError(f"{url} is empty", "the file holds no bytes; re-export it")
    if detect.looks_like_safetensors(head):
        return _load_safetensors(url, head, files, options)
    if detect.is_zip(url, head):
        return torch_zip_sources([url], files, options)[0]
    from memlayout.load.legacy import is_legacy_torch

    if is_legacy_torch(url, head) or head[:1] == b"\x80":
        raise UnrecognizedFormatError(
            f"{url} is a legacy torch.save file or a bare pickle, which memlayout reads from local files only",
            "download it and inspect the local copy; its storages are not located without reading it all",
        )
    if head.lstrip()[:15].lower() in (b"<!doctype html>", b"<!doctype html ") or head.lstrip()[:5].lower() == b"<html":
        from memlayout.io.http_transport import html_page_error

        raise html_page_error(url)
    raise UnrecognizedFormatError(f"{url} is not a checkpoint format memlayout reads remotely")


def header_length(url: str, head: bytes) -> int:
    """A safetensors file's header length, from its first 8 bytes."""
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

    end = min(HEADER_LENGTH_BYTES + header_length(url, head), files.size(url))
    files.read(url, len(head), end)  # the rest of the header, which the first bytes did not hold
    raw = files.read(url, 0, end)
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
    attach_reader(source, files, [url], spans.starts, spans.sizes, None, options)
    return source


