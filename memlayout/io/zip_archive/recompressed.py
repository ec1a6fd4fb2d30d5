"""A torch archive some other tool deflated inside a zip: the one path that still needs `zipfile`."""

from __future__ import annotations

import zipfile
import zlib

from memlayout.errors import CorruptCheckpointError
from memlayout.io.zip_archive.reader import archive_prefix, refuse_inflation

# What `zipfile` raises on a damaged archive (zlib.error: inside its decompressor).
# Only the one path that still needs `zipfile` (a nested archive that some other
# tool recompressed) catches these; everything else raises CorruptCheckpointError.
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, KeyError, NotImplementedError)


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
