"""torch.save zip archives, read without torch and without executing the pickle.

The archive holds `<archive>/data.pkl` and one uncompressed record per storage,
`<archive>/data/<key>`, aligned to 64 bytes (`memlayout.io.zip_archive` reads the
zip). Tensor metadata comes from the pickle through the restricted unpickler;
storage bytes are read in place from the file.

The archive may be a window of a larger file (`read_torch_zip`): torch.export's
older `.pt2` layout stores whole torch.save archives, uncompressed, as members of
its own zip. The storage offsets handed back are absolute in the file, so one
memory map of the outer file serves the nested storages.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from memlayout.errors import CorruptCheckpointError
from memlayout.io.zip_archive import ZipReader, archive_prefix
from memlayout.load.file_source import StorageSpans, pickled_source
from memlayout.load.records import LoadedSource
from memlayout.load.restricted_pickle import UnpickleResult, unpickle


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
    reader = ZipReader(fd, size, base, what)
    try:
        prefix = archive_prefix(reader.names)
        pickle_bytes = reader.read(f"{prefix}data.pkl")
        starts, sizes, checksums = reader.record_spans(f"{prefix}data/")
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
