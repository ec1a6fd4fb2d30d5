"""The loaders of compressed streams and of zip and tar archives: one `LoadedSource` of what is inside.

`memlayout.load.unpack` reads what a container holds; this module is what
`memlayout.load.FORMATS` names for each container format, and turns what was found
into the source the rules read: every global any pickle inside names (with its
member), every member and what it was read as (`LoadedSource.contents`), and the
tensors of the checkpoint inside when the container holds exactly one.
"""

from __future__ import annotations

from typing import Any

from memlayout.errors import UnrecognizedFormatError
from memlayout.format_bytes import counted
from memlayout.load import HEAD_BYTES
from memlayout.load.codecs import opens_a_stream
from memlayout.load.detect import compression_of
from memlayout.load.records import LoadedSource, PickleGlobal
from memlayout.load.unpack import Found, Unpacking

_SHOWN = 12


def confirms_compression(path: str, head: bytes) -> bool:
    """Whether `head` opens a stream its codec decompresses: a weak header (zlib's, lzma's) checked by trying.

    Args:
        path: The file (unused: the first bytes tell).
        head: Its first bytes.

    Returns:
        True when the codec reads the first bytes without an error (or needs a package to tell).
    """
    codec = compression_of(head)
    return codec is not None and opens_a_stream(codec, head)


def _summary(found: list[Found]) -> str:
    kinds: dict[str, int] = {}
    for item in found:
        kind = item.record.what if item.record.format == "data" else item.record.format
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{kind} ({count} files)" if count > 1 else kind for kind, count in kinds.items())


def _source(unpacking: Unpacking, fmt: str) -> LoadedSource:
    found = unpacking.found
    kind = "archive" if fmt in ("zip", "tar") else "stream"
    read = [item for item in found if item.record.format != "data"]
    if not read:
        what = _summary(found) or "nothing"
        raise UnrecognizedFormatError(
            f"{unpacking.path} is a {fmt} {kind} of {what}: no pickle or checkpoint inside",
            "memlayout reads the pickles and checkpoints inside compressed streams and zip and tar archives",
        )
    with_tensors = [item.source for item in read if item.source is not None and item.source.tensors]
    base = with_tensors[0] if len(with_tensors) == 1 else None
    merged: dict[tuple[str, str, str], PickleGlobal] = {}
    for item in read:
        for found_global in item.globals:
            merged.setdefault((found_global.module, found_global.name, found_global.member), found_global)
    members = [f"{item.record.member or 'its stream'} "
               f"({item.record.format if item.record.format != 'data' else item.record.what})"
               for item in found]
    shown = "; ".join(members[:_SHOWN]) + (f"; and {len(members) - _SHOWN} more" if len(members) > _SHOWN else "")
    notes = [f"a {fmt} {kind} holding {counted(len(found), 'file')}, read by content without unpacking it to disk: "
             f"{shown}"]
    if len(with_tensors) > 1:
        notes.append(f"{counted(len(with_tensors), 'checkpoint')} inside: their tensors are not laid out together; "
                     "unpack them to inspect each")
    source = LoadedSource(
        unpacking.path, fmt, base.tensors if base else [], base.storages if base else {},
        modules=base.modules if base else [], declared_ties=base.declared_ties if base else [],
        reader=base.reader if base else None, pickle_globals=list(merged.values()),
        legacy_format=base.legacy_format if base else False, notes=notes + (base.notes if base else []),
        contents=[item.record for item in found],
    )
    if base is None or base.reader is None:
        source.content_unreadable = (base.content_unreadable if base else "") or (
            f"the tensors inside a {fmt} {kind} are read only where one checkpoint holds them all")
    unpacking.close(keep=base)
    return source


def _unpack(path: str, fmt: str, read: Any) -> LoadedSource:
    unpacking = Unpacking(path)
    try:
        read(unpacking)
        return _source(unpacking, fmt)
    except BaseException:
        unpacking.close()
        raise


def load_compressed(path: str) -> LoadedSource:
    """Read a compressed file (`detect.CODECS`): what it decompresses to, by content, executing nothing.

    Args:
        path: The file.

    Returns:
        A source of the stream's format ("gzip", "zlib", ...): every global its pickles
        name, and the tensors of the checkpoint inside where it holds one.

    Raises:
        UnrecognizedFormatError: it holds no pickle and no checkpoint.
        CorruptCheckpointError: a damaged stream or pickle inside.
        UnpackLimitError: a cap was reached (a decompression bomb, containers nested too deep).
    """
    with open(path, "rb") as handle:
        fmt = compression_of(handle.read(HEAD_BYTES)) or "compressed"
        handle.seek(0)
        return _unpack(path, fmt, lambda unpacking: unpacking.stream(handle, "", ()))


def load_zip_archive(path: str) -> LoadedSource:
    """Read a zip archive that is no torch.save, TorchScript, torch.export or numpy file: each member by content.

    Args:
        path: The file.

    Returns:
        A source of format "zip" (see `load_compressed`).

    Raises:
        As `load_compressed`.
    """
    return _unpack(path, "zip", lambda unpacking: unpacking.zip(path, "", ("zip",)))


def load_tar_archive(path: str) -> LoadedSource:
    """Read a tar archive that is no torch.save tar: each member by content, as it streams by.

    Args:
        path: The file.

    Returns:
        A source of format "tar" (see `load_compressed`).

    Raises:
        As `load_compressed`.
    """
    with open(path, "rb") as handle:
        return _unpack(path, "tar", lambda unpacking: unpacking.tar(handle, "", ("tar",)))
