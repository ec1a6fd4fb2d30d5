"""torch.save zip archives, read without torch and without executing the pickle.

The archive holds `<archive>/data.pkl` and one uncompressed record per storage,
`<archive>/data/<key>`, aligned to 64 bytes. Tensor metadata comes from the pickle
through the restricted unpickler; storage bytes are read in place from the file.
"""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
from dataclasses import dataclass

from memlayout.errors import CorruptCheckpointError
from memlayout.load.pickled_tree import declared_ties_in_tree, module_records, tensor_records
from memlayout.load.records import LoadedSource
from memlayout.load.restricted_pickle import unpickle

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_HEADER_MAGIC = b"PK\x03\x04"


@dataclass
class ZipStorageReader:
    """Reads storage bytes straight out of the archive's uncompressed records."""

    mapped: mmap.mmap
    data_start: dict[str, int]
    data_size: dict[str, int]

    def read(self, storage_key: str, start: int, length: int) -> memoryview:
        size = self.data_size[storage_key]
        if start < 0 or start + length > size:
            raise CorruptCheckpointError(
                f"storage {storage_key} is {size} bytes, but a tensor reads bytes {start}..{start + length}"
            )
        base = self.data_start[storage_key]
        return memoryview(self.mapped)[base + start : base + start + length]

    def close(self) -> None:
        self.mapped.close()


def archive_prefix(names: list[str]) -> str:
    """The archive's top folder: the one holding data.pkl."""
    for name in names:
        if name.endswith("/data.pkl") and name.count("/") == 1:
            return name[: -len("data.pkl")]
    raise CorruptCheckpointError("the zip has no <archive>/data.pkl: it is not a torch.save file")


def _record_offsets(
    mapped: mmap.mmap, infos: list[zipfile.ZipInfo], prefix: str
) -> tuple[dict[str, int], dict[str, int]]:
    data_prefix = f"{prefix}data/"
    starts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for info in infos:
        if not info.filename.startswith(data_prefix) or info.filename.endswith("/"):
            continue
        key = info.filename[len(data_prefix) :]
        if info.compress_type != zipfile.ZIP_STORED:
            raise CorruptCheckpointError(f"storage record {info.filename} is compressed; torch.save never does that")
        header = mapped[info.header_offset : info.header_offset + _LOCAL_HEADER.size]
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_HEADER_MAGIC:
            raise CorruptCheckpointError(f"the zip entry for {info.filename} is damaged")
        fields = _LOCAL_HEADER.unpack(header)
        name_length, extra_length = fields[9], fields[10]
        start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        if start + info.file_size > len(mapped):
            raise CorruptCheckpointError(f"storage record {info.filename} runs past the end of the file")
        starts[key] = start
        sizes[key] = info.file_size
    return starts, sizes


def load_torch_zip(path: str) -> LoadedSource:
    """Read a torch.save zip archive as metadata, without executing its pickle.

    Args:
        path: The .pt / .pth / .bin file.

    Returns:
        A `LoadedSource` whose reader maps storage bytes from the file.

    Raises:
        CorruptCheckpointError: the zip or the pickle inside is damaged.
    """
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise CorruptCheckpointError(f"{path} is empty")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            try:
                archive = zipfile.ZipFile(handle)
                infos = archive.infolist()
            except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
                raise CorruptCheckpointError(f"{path} is not a readable zip archive: {exc}") from exc
            prefix = archive_prefix([info.filename for info in infos])
            try:
                pickle_bytes = archive.read(f"{prefix}data.pkl")
            except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as exc:
                raise CorruptCheckpointError(f"{path}: data.pkl cannot be read: {exc}") from exc
            starts, sizes = _record_offsets(mapped, infos, prefix)
            result = unpickle(pickle_bytes)
            tensors, storages = tensor_records(result.root, starts)
            for key, storage in storages.items():
                if storage.device != "meta" and key not in starts:
                    raise CorruptCheckpointError(f"{path}: the pickle names storage {key}, which the archive lacks")
                if key in sizes and storage.nbytes > sizes[key]:
                    raise CorruptCheckpointError(
                        f"{path}: storage {key} should hold {storage.nbytes} bytes but its record has {sizes[key]}"
                    )
        except BaseException:
            mapped.close()
            raise
    reader = ZipStorageReader(mapped, starts, sizes)
    return LoadedSource(
        path=path,
        format="torch-zip",
        tensors=tensors,
        storages=storages,
        modules=module_records(result.root),
        declared_ties=declared_ties_in_tree(result.root, [t.name for t in tensors]),
        reader=reader,
        pickle_globals=result.globals,
        close=reader.close,
    )
