"""Loaders: every source memlayout reads, reduced to `LoadedSource` records.

Formats are detected by content, never by extension. Each format is one entry of
`FORMATS`, data: a cheap `detect` on the path and its first bytes (`load.detect`,
which imports no loader), and the module and function that load it. Reading a
file imports its own loader and no other.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from memlayout.errors import (
    CorruptCheckpointError,
    MemlayoutError,
    SourceNotFoundError,
    UnrecognizedFormatError,
    UsageError,
)
from memlayout.load import detect
from memlayout.load.records import LoadedSource
from memlayout.load.remote_location import RemoteOptions, remote_location

HEAD_BYTES = detect.TAR_BLOCK
"""Bytes read to recognize a file: one read of a tar's first block costs what 64 bytes do, and
then no check reads a small file a second time (a folder walk reads thousands of them)."""


class Format(NamedTuple):
    """One readable format, described as data: its loader's module is imported only to read it."""

    name: str
    module: str
    """The loader's module, e.g. "memlayout.load.torch_zip"."""
    load: str
    """The function of `module` that reads it: path -> `LoadedSource`, executing nothing from the file."""
    detect: Callable[[str, bytes], bool]
    """(path, first bytes or b"" for a directory) -> whether this may be the format (`memlayout.load.detect`)."""
    confirm: str | None = None
    """A function of `module`, (path, head) -> bool, run only when `detect` says yes: where the first
    bytes match but only the loader can tell (a pickle's first object, a tar's first member)."""


# Order matters where formats nest: a TorchScript archive is also a zip. The tar
# check reads one 512-byte block, so it runs after the cheaper zip checks.
FORMATS: list[Format] = [
    Format("safetensors", "memlayout.load.safetensors_file", "load_safetensors", detect.is_safetensors),
    Format("npy", "memlayout.load.numpy_file", "load_npy", detect.is_npy),
    Format("dcp", "memlayout.load.dcp", "load_dcp", detect.is_dcp_dir),
    Format("hf-dir", "memlayout.load.hf_dir", "load_hf_dir", detect.is_hf_dir),
    Format("torch-export", "memlayout.load.pt2", "load_pt2", detect.is_pt2_zip),
    Format("torchscript", "memlayout.load.torchscript", "load_torchscript", detect.is_torchscript_zip),
    Format("npz", "memlayout.load.numpy_file", "load_npz", detect.is_npz),
    # A zip that names no data.pkl is an archive of other files, read member by member.
    Format("zip", "memlayout.load.containers", "load_zip_archive", detect.is_plain_zip),
    Format("torch-zip", "memlayout.load.torch_zip", "load_torch_zip", detect.is_zip),
    Format("torch-legacy-tar", "memlayout.load.legacy_tar", "load_legacy_tar", detect.has_tar_magic,
           confirm="is_legacy_tar"),
    Format("tar", "memlayout.load.containers", "load_tar_archive", detect.has_tar_magic),
    Format("torch-legacy", "memlayout.load.legacy", "load_legacy", detect.opens_like_a_pickle,
           confirm="is_legacy_torch"),
    Format("pickle", "memlayout.load.legacy", "load_bare_pickle", detect.opens_like_a_pickle, confirm="is_pickle"),
    # Compressed streams, last: zlib's and lzma's headers are weak, and confirmed by decompressing.
    *[
        Format(codec.name, "memlayout.load.containers", "load_compressed",
               functools.partial(detect.compresses_as, codec.name),
               confirm="confirms_compression")
        for codec in detect.CODECS
    ],
]


def _function(fmt: Format, name: str) -> Callable[..., Any]:
    """A function of the format's loader module, importing that module (and no other loader) on first use."""
    found: Callable[..., Any] = getattr(importlib.import_module(fmt.module), name)
    return found


def _recognizes(fmt: Format, path: str, head: bytes) -> bool:
    if not fmt.detect(path, head):
        return False
    return fmt.confirm is None or bool(_function(fmt, fmt.confirm)(path, head))


def _read_head(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(HEAD_BYTES)


def _detected(path: str) -> tuple[Format, bytes]:
    """The format that reads the file or directory at `path`, and its first bytes (b"" for a directory)."""
    if os.path.isdir(path):
        head = b""
    else:
        try:
            head = _read_head(path)
        except OSError as exc:
            raise SourceNotFoundError(f"{path}: cannot be read: {exc.strerror}") from exc
        if not head:
            raise CorruptCheckpointError(f"{path} is empty", "the file holds no bytes; re-export it")
    for fmt in FORMATS:
        if _recognizes(fmt, path, head):
            return fmt, head
    if not head:
        raise UnrecognizedFormatError(f"{path} is a directory with no model memlayout can read")
    archive = detect.unopened_archive(head)
    if archive is not None:
        raise UnrecognizedFormatError(f"{path} is {archive}, which memlayout does not open: what it holds is "
                                      "not audited", "extract it and inspect the files")
    raise UnrecognizedFormatError(f"{path} is not a checkpoint format memlayout recognizes")


def recognized_format(path: str, head: bytes) -> str | None:
    """The format whose checks recognize a file by its first bytes, or None; never raises.

    What a folder walk asks of each file: `head` is what it read (`HEAD_BYTES`, or
    the whole of a shorter file), and only a format whose first bytes match imports
    its loader to confirm.

    Args:
        path: A file.
        head: Its first bytes; b"" for an empty file.

    Returns:
        The `FORMATS` name, or None for an empty file or content no format recognizes.
    """
    if not head:
        return None
    for fmt in FORMATS:
        # Once per file of a folder walk: the cheap checks inline, a loader only to confirm.
        if not fmt.detect(path, head):
            continue
        try:
            if fmt.confirm is None or _function(fmt, fmt.confirm)(path, head):
                return fmt.name
        except (MemlayoutError, OSError, ValueError):
            continue  # a check that cannot read the file says no; a later format may still say yes
    return None


def detect_format(path: str) -> str:
    """Which format a file or directory is, by its content, reading nothing more than detection needs.

    Args:
        path: A file or directory that exists.

    Returns:
        The name of the format `load_path` reads it as (a `FORMATS` name, e.g. "safetensors").

    Raises:
        SourceNotFoundError: the file cannot be read.
        CorruptCheckpointError: the file is empty.
        UnrecognizedFormatError: no format recognizes the content.
    """
    if not os.path.exists(path):
        raise SourceNotFoundError(f"{path}: no such file or directory")
    return _detected(path)[0].name


def load_path(path: str, remote: RemoteOptions | None = None) -> LoadedSource:
    """Load a file, a directory, a URL, a Hub model or an import spec.

    No loader runs code from a file: pickles are read by the restricted unpickler.
    Only an import spec runs code, the user's own, by design.

    Args:
        path: A checkpoint file, a model directory, an https:// (or s3://, gs://)
            URL, `hf://ORG/NAME[@REVISION][/PATH]`, a bare Hub id with no local path
            of that name (`memlayout.load.remote_location`), or `pkg.module:callable`.
        remote: How a remote path is read (timeout, full downloads, tensor bytes);
            None for a caller that reads local files only (flatten writes from
            what it reads, and its --trust must never reach a remote file).

    Returns:
        The `LoadedSource` of the first format that recognizes the content.

    Raises:
        SourceNotFoundError: nothing exists at `path` and it is no import spec.
        UsageError: `path` is remote and `remote` is None.
        RemoteReadError: a remote read failed (memlayout.io.remote).
        UnrecognizedFormatError: no format recognizes the content.
        CorruptCheckpointError: the content is recognized but damaged.
    """
    if not os.path.exists(path):
        location = remote_location(path)
        if location is not None:
            if remote is None:
                raise UsageError(
                    f"{path} is remote, and this command reads local files only",
                    "download it first; inspect and diff read URLs and Hub models",
                )
            from memlayout.load.remote import load_remote

            return load_remote(location, remote)
        from memlayout.load.import_spec import load_import_spec, looks_like_spec

        if looks_like_spec(path):
            return load_import_spec(path)
        raise SourceNotFoundError(f"{path}: no such file or directory")
    fmt, head = _detected(path)
    try:
        source: LoadedSource = _function(fmt, fmt.load)(path)
    except RecursionError:
        # Walking a pickle's object tree recurses once per level; a file can
        # nest 100,000 lists in a few hundred bytes. No model nests that deep.
        raise CorruptCheckpointError(
            f"{path} nests containers more than {sys.getrecursionlimit()} levels deep, "
            "which no checkpoint does"
        ) from None
    if head:
        from memlayout.load.polyglot import also_valid_as

        source.also_valid_as = also_valid_as(path, head, fmt.name)
    return source


def load_object(obj: Any) -> LoadedSource:
    """Load a live object (nn.Module, state dict, nested checkpoint)."""
    from memlayout.load.live import load_live

    return load_live(obj)
