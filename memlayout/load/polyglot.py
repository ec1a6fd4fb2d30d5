"""Which other formats a file is also valid as: a polyglot reads differently in different tools.

torch.load decides by the first bytes (a zip header, or else a pickle or tar), zip
readers look for the end record at the other end, tar readers check a header
checksum, and pickle.load starts at byte 0. A file can satisfy several of them at
once, and fickling's `polyglot.py` builds such files on purpose: a scanner that
reads the zip sees a clean `data.pkl` while torch.load runs the pickle in front
of it. memlayout reads the format torch.load reads and names every other one the
file is valid as (`LoadedSource.also_valid_as`), which ML603 reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from memlayout.errors import MemlayoutError
from memlayout.load.detect import looks_like_safetensors, opens_like_a_pickle

FAMILY = {
    "torch-zip": "zip", "torchscript": "zip", "torch-export": "zip",
    "torch-legacy": "pickle", "pickle": "pickle",
    "torch-legacy-tar": "tar",
    "safetensors": "safetensors",
}
"""The container family of each file format memlayout reads."""


_ZIP_END = b"PK\x05\x06"
_ZIP_END_SEARCH = 22 + 0xFFFF
"""zipfile looks for the end record in the last 64 KiB and 22 bytes; without one it refuses the file."""


def _is_zip(path: str, head: bytes) -> bool:
    # zipfile, not memlayout's own reader: zip tools accept data in front of the
    # archive (they shift every offset by it), and what they accept is the question.
    # Most files have no end record where zipfile looks, and need no zipfile at all.
    with open(path, "rb") as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - _ZIP_END_SEARCH))
        if _ZIP_END not in handle.read():
            return False
    import zipfile

    from memlayout.io.zip_archive import ZIP_ERRORS

    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.infolist())
    except ZIP_ERRORS:
        return False


def _is_pickle(path: str, head: bytes) -> bool:
    # pickle.load starts at byte 0 with whatever opcode is there (PROTO only from
    # protocol 2 on); the restricted unpickler must read one whole pickle, executing nothing.
    if not opens_like_a_pickle(path, head):
        return False  # most files: no need to import the unpickler to say no
    from memlayout.load.restricted_pickle import read_first_pickle

    return read_first_pickle(path).complete


def _is_tar(path: str, head: bytes) -> bool:
    import tarfile

    with open(path, "rb") as handle:
        block = handle.read(tarfile.BLOCKSIZE)
    try:
        return bool(tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape").name)
    except (tarfile.HeaderError, ValueError):
        return False


def _is_safetensors(path: str, head: bytes) -> bool:
    if not looks_like_safetensors(head):
        return False  # most files: no need to import the safetensors loader to say no
    from memlayout.load.safetensors_file import read_header

    try:
        read_header(path)
    except (MemlayoutError, OSError, ValueError):
        return False
    return True


_CHECKS: dict[str, Callable[[str, bytes], bool]] = {
    "zip": _is_zip, "pickle": _is_pickle, "tar": _is_tar, "safetensors": _is_safetensors,
}


def also_valid_as(path: str, head: bytes, loaded_format: str) -> tuple[str, ...]:
    """The container formats other than the loaded one's that the file is also valid as.

    Args:
        path: A file (never a directory).
        head: Its first bytes.
        loaded_format: The format memlayout read it as (a `FORMATS` name).

    Returns:
        Names among "zip", "pickle", "tar", "safetensors", in that order; empty for
        an ordinary file.
    """
    own = FAMILY.get(loaded_format)
    if own is None:
        return ()
    return tuple(name for name, check in _CHECKS.items() if name != own and check(path, head))
