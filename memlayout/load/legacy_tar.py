"""torch.save's first format, a tar archive, read without executing it.

Early torch.save (before the pickled-magic-number format that legacy.py reads)
wrote a POSIX tar with the members `sys_info`, `pickle`, `tensors` and `storages`,
and torch.load still reads it with `weights_only=False` (`legacy_load` in
torch/serialization.py), which needs only the last three:

- `storages`: a pickled count; per storage a pickled `(key, location, storage
  class)`, an 8-byte little-endian element count and the raw bytes; then a pickled
  list of storage views `(view key, root key, offset, numel)`, each a slice of a
  storage already listed.
- `tensors`: a pickled count; per tensor a pickled `(key, storage key, tensor
  class)`, an int32 ndim, 4 pad bytes (ndim was once 8 bytes), ndim int64 sizes,
  ndim int64 strides and an int64 storage offset, in elements.
- `pickle`: the saved object. Its persistent ids are tensor or storage keys as
  decimal strings, or `(class, source file, source)` for each nn.Module class.

Members are located from the tar headers, parsed by `tarfile` but never
extracted; every pickle goes through the restricted unpickler; and storage bytes
are served in place from the file. A tensor on a storage view is reported on the
view's root storage at the view's offset, so aliasing across views is exact.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
from dataclasses import dataclass
from typing import Any

from memlayout.dtypes import dtype_info
from memlayout.errors import CorruptCheckpointError
from memlayout.load.detect import has_tar_magic
from memlayout.load.file_source import StorageSpans, pickled_source
from memlayout.load.legacy import merge_globals, refuse_big_endian
from memlayout.load.pickled_objects import PickledStorage, PickledTensor, StorageDtype
from memlayout.load.records import LoadedSource, PickleGlobal
from memlayout.load.restricted_pickle import RestrictedUnpickler, run_unpickler

# The order torch.save wrote them; torch.load reads all but sys_info.
_MEMBERS = ("sys_info", "pickle", "tensors", "storages")
_REQUIRED = ("storages", "tensors", "pickle")
_COUNT = struct.Struct("<q")
_NDIM = struct.Struct("<i4x")
_INT64 = 8
_TAR_ERRORS = (tarfile.TarError, OSError, ValueError, UnicodeDecodeError, EOFError)


@dataclass(frozen=True)
class _Member:
    """Where one tar member's data lies in the file."""

    name: str
    start: int
    size: int


@dataclass(frozen=True)
class _StorageSlice:
    """What a storage key stands for: elements [offset, offset + numel) of a root storage."""

    root: PickledStorage
    offset: int
    numel: int


def is_legacy_tar(path: str, head: bytes) -> bool:
    """Whether the file is a tar-format torch.save file.

    Args:
        path: The file.
        head: Its first bytes; b"" for a directory.

    Returns:
        True when the tar magic sits at byte 257 and the first member is one that
        torch.save writes, so a torch tar cut short is still recognized (and then
        reported as damaged) while other tar archives are not.
    """
    if not has_tar_magic(path, head):
        return False
    try:
        # tarfile resolves PAX extended headers, which Python's tarfile wrote
        # before each member whose modification time was fractional.
        with open(path, "rb") as handle, tarfile.open(fileobj=handle, mode="r:") as tar:
            first = tar.next()
    except _TAR_ERRORS:
        return False
    return first is not None and first.name in _MEMBERS


class _MemberStream(io.RawIOBase):
    """One tar member's data as a file: read with pread, never past the member's end.

    Metadata reads stay off the memory map (see mapped_files.py), and a damaged
    pickle cannot borrow bytes from the next member.
    """

    def __init__(self, fd: int, member: _Member) -> None:
        super().__init__()
        self._fd = fd
        self._start = member.start
        self._size = member.size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        # The views are released on return: BufferedReader frees its buffer right
        # after, and a view still alive there is a SystemError.
        with memoryview(buffer) as outer, outer.cast("B") as view:
            length = max(0, min(len(view), self._size - self._position))
            data = os.pread(self._fd, length, self._start + self._position)
            view[: len(data)] = data
        self._position += len(data)
        return len(data)


class _MemberReader:
    """Reads one member front to back: pickles through the restricted unpickler, and raw fields."""

    def __init__(
        self, path: str, fd: int, member: _Member, objects: dict[int, PickledTensor | _StorageSlice] | None = None
    ) -> None:
        # `objects` are what the `pickle` member's persistent ids name; torch reads
        # the other members with plain pickle.load, so there they are refused.
        self.path = path
        self.member = member
        self.stream = io.BufferedReader(_MemberStream(fd, member))
        self.objects = objects
        self.referenced: dict[tuple[str, str], PickleGlobal] = {}
        self.made_placeholders = False

    def load(self, what: str) -> Any:
        # A fresh unpickler per pickle: one that has loaded keeps what it read
        # ahead, so it would miss the raw fields read between two pickles.
        unpickler = (
            RestrictedUnpickler(self.stream, False, "utf-8")
            if self.objects is None
            else _TarPickleUnpickler(self.stream, self.objects)
        )
        try:
            return run_unpickler(unpickler, f"{self.path}: {what} in the tar member {self.member.name}")
        finally:
            self.referenced.update(unpickler.referenced)
            self.made_placeholders |= unpickler.made_placeholders

    @property
    def remaining(self) -> int:
        return self.member.size - self.stream.tell()

    def read_exactly(self, length: int, what: str) -> bytes:
        # Checked before reading: a damaged count must not become a huge allocation.
        if length > self.remaining:
            raise CorruptCheckpointError(
                f"{self.path}: {what} runs past the end of the tar member {self.member.name}"
            )
        return self.stream.read(length)

    def skip(self, length: int) -> None:
        self.stream.seek(self.stream.tell() + length)

    def count(self, what: str) -> int:
        value = self.load(f"the {what} count")
        if type(value) is not int or value < 0:
            raise CorruptCheckpointError(f"{self.path}: the {what} count is {value!r:.40}, not a count")
        return value


class _TarPickleUnpickler(RestrictedUnpickler):
    """The restricted unpickler, with the `pickle` member's persistent ids and Parameters."""

    def __init__(self, stream: io.BufferedIOBase, objects: dict[int, PickledTensor | _StorageSlice]) -> None:
        super().__init__(stream, False, "utf-8")
        self._objects = objects

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple):
            # (class, source file, source) of an nn.Module class: torch returns the
            # class, here already a placeholder, and only compares the source.
            if not pid:
                raise pickle.UnpicklingError("empty persistent id")
            return pid[0]
        if type(pid) not in (str, bytes, int):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        try:
            found = self._objects.get(int(pid))
        except ValueError:
            found = None
        if found is None:
            raise pickle.UnpicklingError(f"persistent id {pid!r:.40} names no tensor or storage of the file")
        # A storage pickled on its own (not through a tensor) holds no tensor to report.
        return found.root if isinstance(found, _StorageSlice) else found


def _members(path: str, handle: io.BufferedReader, file_size: int) -> dict[str, _Member]:
    try:
        with tarfile.open(fileobj=handle, mode="r:") as tar:
            infos = tar.getmembers()
    except _TAR_ERRORS as exc:
        # tarfile checks that each member's data is there before reading the next
        # header, so a cut anywhere past the first header ends up here.
        raise CorruptCheckpointError(
            f"{path}: the tar archive is damaged or cut short: {exc}", "re-export it from its source"
        ) from exc
    # torch finds members with getmember, which takes the last of a name.
    found = {info.name: info for info in infos if info.name in _MEMBERS}
    members: dict[str, _Member] = {}
    for name, info in found.items():
        if not info.isfile() or info.issparse():
            raise CorruptCheckpointError(f"{path}: the tar member {name} is not a plain file, as torch.save wrote it")
        if info.offset_data + info.size > file_size:
            raise CorruptCheckpointError(
                f"{path}: the tar member {name} runs past the end of the file"
            )
        members[name] = _Member(name, info.offset_data, info.size)
    missing = [name for name in _REQUIRED if name not in members]
    if missing:
        raise CorruptCheckpointError(
            f"{path}: the tar lacks the member(s) {', '.join(missing)} that torch.save writes"
        )
    return members


def _key(value: Any, path: str, what: str) -> int:
    # torch keys its objects by the integers the writer took from C pointers.
    if type(value) is not int:
        raise CorruptCheckpointError(f"{path}: {what} is {value!r:.40}, not an integer key")
    return value


def _read_storages(
    path: str, reader: _MemberReader
) -> tuple[dict[int, _StorageSlice], dict[str, int], dict[str, int]]:
    """Every storage key's slice, and the absolute start and byte size of each root's data."""
    slices: dict[int, _StorageSlice] = {}
    starts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for _ in range(reader.count("storage")):
        record = reader.load("a storage record")
        if not (isinstance(record, tuple) and len(record) == 3):
            raise CorruptCheckpointError(f"{path}: a storage record is {record!r:.60}, not (key, location, type)")
        key = _key(record[0], path, "a storage key")
        location, storage_type = record[1], record[2]
        if type(storage_type) is not StorageDtype or type(location) is not str:
            raise CorruptCheckpointError(
                f"{path}: storage {key} has type {storage_type!r:.40} at {location!r:.40}, not a torch storage"
            )
        (numel,) = _COUNT.unpack(reader.read_exactly(_COUNT.size, f"storage {key}'s element count"))
        if numel < 0:
            raise CorruptCheckpointError(f"{path}: storage {key} claims {numel} elements")
        nbytes = numel * dtype_info(storage_type.dtype).itemsize
        start = reader.member.start + reader.stream.tell()
        if nbytes > reader.remaining:
            raise CorruptCheckpointError(
                f"{path}: storage {key} ({nbytes} bytes) runs past the end of the tar member storages"
            )
        reader.skip(nbytes)
        root = PickledStorage(str(key), storage_type.dtype, location, numel, nbytes)
        slices[key] = _StorageSlice(root, 0, numel)
        starts[root.key], sizes[root.key] = start, nbytes
    views = reader.load("the storage view list")
    if not isinstance(views, list):
        raise CorruptCheckpointError(f"{path}: the storage view list is {views!r:.40}, not a list")
    for view in views:
        if not (isinstance(view, tuple) and len(view) == 4):
            raise CorruptCheckpointError(f"{path}: a storage view is {view!r:.60}, not (key, root, offset, numel)")
        target, root_key = _key(view[0], path, "a storage view key"), _key(view[1], path, "a view's root key")
        offset, numel = _key(view[2], path, "a view's offset"), _key(view[3], path, "a view's size")
        base = slices.get(root_key)
        if base is None:
            raise CorruptCheckpointError(f"{path}: storage view {target} slices storage {root_key}, which the file "
                                         "lacks")
        if offset < 0 or numel < 0 or offset + numel > base.numel:
            raise CorruptCheckpointError(
                f"{path}: storage view {target} (elements {offset}..{offset + numel}) "
                f"runs past the {base.numel} elements of storage {root_key}"
            )
        slices[target] = _StorageSlice(base.root, base.offset + offset, numel)
    return slices, starts, sizes


def _read_tensors(path: str, reader: _MemberReader, slices: dict[int, _StorageSlice]) -> dict[int, PickledTensor]:
    tensors: dict[int, PickledTensor] = {}
    for _ in range(reader.count("tensor")):
        record = reader.load("a tensor record")
        if not (isinstance(record, tuple) and len(record) == 3):
            raise CorruptCheckpointError(f"{path}: a tensor record is {record!r:.60}, not (key, storage, type)")
        key = _key(record[0], path, "a tensor key")
        storage_id = record[1]
        where = slices.get(storage_id) if type(storage_id) is int else None
        if where is None:
            # Also a storage of None, which torch wrote for a tensor without one and cannot read back.
            raise CorruptCheckpointError(f"{path}: tensor {key} names storage {storage_id!r:.40}, which the file lacks")
        (ndim,) = _NDIM.unpack(reader.read_exactly(_NDIM.size, f"tensor {key}'s metadata"))
        if ndim < 0:
            raise CorruptCheckpointError(f"{path}: tensor {key} claims {ndim} dimensions")
        values = struct.unpack(
            f"<{2 * ndim + 1}q", reader.read_exactly((2 * ndim + 1) * _INT64, f"tensor {key}'s metadata")
        )
        shape, stride, offset = values[:ndim], values[ndim : 2 * ndim], values[2 * ndim]
        _check_extent(path, key, shape, stride, offset, where.numel)
        tensors[key] = PickledTensor(where.root, where.offset + offset, shape, stride, where.root.dtype)
    return tensors


def _check_extent(
    path: str, key: int, shape: tuple[int, ...], stride: tuple[int, ...], offset: int, numel: int
) -> None:
    # torch's Tensor.set_ refuses the same: negative sizes or strides, and views
    # that reach past their storage (a view storage is only its slice).
    if min(shape, default=0) < 0 or min(stride, default=0) < 0 or offset < 0:
        raise CorruptCheckpointError(f"{path}: tensor {key} has shape {shape}, stride {stride}, offset {offset}")
    if 0 in shape:
        return
    last = offset + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    if last >= numel:
        raise CorruptCheckpointError(
            f"{path}: tensor {key} (shape {list(shape)}, stride {list(stride)}, offset {offset}) "
            f"reaches past the {numel} elements of its storage"
        )


def load_legacy_tar(path: str) -> LoadedSource:
    """Read a tar-format torch.save file as metadata, executing nothing from it.

    Args:
        path: The file.

    Returns:
        A `LoadedSource` with `legacy_format=True` and a reader over a memory map.

    Raises:
        CorruptCheckpointError: the tar, a pickle, or the storage and tensor
            records are damaged or truncated.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        file_size = os.fstat(fd).st_size
        with open(fd, "rb", closefd=False) as handle:
            members = _members(path, handle, file_size)
        readers: list[_MemberReader] = []
        if "sys_info" in members:
            info_reader = _MemberReader(path, fd, members["sys_info"])
            sys_info = info_reader.load("the system info")
            readers.append(info_reader)
            refuse_big_endian(path, sys_info)
        storage_reader = _MemberReader(path, fd, members["storages"])
        slices, starts, sizes = _read_storages(path, storage_reader)
        tensor_reader = _MemberReader(path, fd, members["tensors"])
        tensors = _read_tensors(path, tensor_reader, slices)
        # One table of keys, as torch keeps: a tensor key shadows a storage key.
        objects: dict[int, PickledTensor | _StorageSlice] = {**slices, **tensors}
        main_reader = _MemberReader(path, fd, members["pickle"], objects)
        root = main_reader.load("the object")
        readers += [storage_reader, tensor_reader, main_reader]
    finally:
        os.close(fd)
    # torch.load extracts each storage into fresh memory; nothing is used in place.
    return pickled_source(
        path, "torch-legacy-tar", root, StorageSpans(starts, sizes), used_in_place=False,
        pickle_globals=merge_globals(r.referenced for r in readers),
        made_placeholders=main_reader.made_placeholders,
        legacy_format=True,
    )
