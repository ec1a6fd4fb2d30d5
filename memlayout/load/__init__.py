"""Loaders: every source memlayout reads, reduced to `LoadedSource` records.

Formats are detected by content, never by extension. Each format is one entry of
`FORMATS`: a cheap `detect` on the path and its first bytes, and a `load`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from memlayout.errors import (
    CorruptCheckpointError,
    SourceNotFoundError,
    UnrecognizedFormatError,
    UsageError,
)
from memlayout.load.records import LoadedSource
from memlayout.load.remote_location import RemoteOptions, remote_location

HEAD_BYTES = 64


class Format(NamedTuple):
    """One readable format."""

    name: str
    detect: Callable[[str, bytes], bool]
    """(path, first bytes or b"" for a directory) -> whether this format reads it."""
    load: Callable[[str], LoadedSource]
    """path -> what the file holds, read without executing anything from it."""


def _is_torch_zip(path: str, head: bytes) -> bool:
    return head.startswith(b"PK\x03\x04")


def _load_torch_zip(path: str) -> LoadedSource:
    from memlayout.load.torch_zip import load_torch_zip

    return load_torch_zip(path)


def _is_safetensors(path: str, head: bytes) -> bool:
    from memlayout.load.safetensors_file import looks_like_safetensors

    return looks_like_safetensors(head)


def _load_safetensors(path: str) -> LoadedSource:
    from memlayout.load.safetensors_file import load_safetensors

    return load_safetensors(path)


def _is_hf_dir(path: str, head: bytes) -> bool:
    if head:  # a file: no need to import the directory format's module to say no
        return False
    from memlayout.load.hf_dir import is_hf_dir

    return is_hf_dir(path)


def _load_hf_dir(path: str) -> LoadedSource:
    from memlayout.load.hf_dir import load_hf_dir

    return load_hf_dir(path)


def _is_legacy(path: str, head: bytes) -> bool:
    from memlayout.load.legacy import is_legacy_torch

    return is_legacy_torch(head)


def _load_legacy(path: str) -> LoadedSource:
    from memlayout.load.legacy import load_legacy

    return load_legacy(path)


def _is_legacy_tar(path: str, head: bytes) -> bool:
    from memlayout.load.legacy_tar import is_legacy_tar

    return is_legacy_tar(path, head)


def _load_legacy_tar(path: str) -> LoadedSource:
    from memlayout.load.legacy_tar import load_legacy_tar

    return load_legacy_tar(path)


def _is_bare_pickle(path: str, head: bytes) -> bool:
    from memlayout.load.legacy import is_pickle

    return is_pickle(path, head)


def _load_bare_pickle(path: str) -> LoadedSource:
    from memlayout.load.legacy import load_bare_pickle

    return load_bare_pickle(path)


def _is_torchscript(path: str, head: bytes) -> bool:
    from memlayout.load.torchscript import is_torchscript_zip

    return _is_torch_zip(path, head) and is_torchscript_zip(path)


def _load_torchscript(path: str) -> LoadedSource:
    from memlayout.load.torchscript import load_torchscript

    return load_torchscript(path)


def _is_dcp_dir(path: str, head: bytes) -> bool:
    if head:  # a file: no need to import the directory format's module to say no
        return False
    from memlayout.load.dcp import is_dcp_dir

    return is_dcp_dir(path)


def _load_dcp_dir(path: str) -> LoadedSource:
    from memlayout.load.dcp import load_dcp

    return load_dcp(path)


def _is_pt2(path: str, head: bytes) -> bool:
    from memlayout.load.pt2 import is_pt2_zip

    return _is_torch_zip(path, head) and is_pt2_zip(path)


def _load_pt2(path: str) -> LoadedSource:
    from memlayout.load.pt2 import load_pt2

    return load_pt2(path)


# Order matters where formats nest: a TorchScript archive is also a zip. The tar
# check reads one 512-byte block, so it runs after the cheaper zip checks.
FORMATS: list[Format] = [
    Format("safetensors", _is_safetensors, _load_safetensors),
    Format("dcp", _is_dcp_dir, _load_dcp_dir),
    Format("hf-dir", _is_hf_dir, _load_hf_dir),
    Format("torch-export", _is_pt2, _load_pt2),
    Format("torchscript", _is_torchscript, _load_torchscript),
    Format("torch-zip", _is_torch_zip, _load_torch_zip),
    Format("torch-legacy-tar", _is_legacy_tar, _load_legacy_tar),
    Format("torch-legacy", _is_legacy, _load_legacy),
    Format("pickle", _is_bare_pickle, _load_bare_pickle),
]


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
        if fmt.detect(path, head):
            return fmt, head
    if not head:
        raise UnrecognizedFormatError(f"{path} is a directory with no model memlayout can read")
    raise UnrecognizedFormatError(f"{path} is not a checkpoint format memlayout recognizes")


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
        source = fmt.load(path)
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
