"""How every loader of a file ends: records first, then the reader, then `LoadedSource`.

A loader parses its format's metadata into tensor and storage records and knows
where each storage's bytes lie in the file. What is left is the same for every
format, and lives here once: build the records, map the file only when nothing
can fail any more (so a failed load leaves nothing open to close), and hand the
reader to the `LoadedSource`, whose `close` or `with` block releases it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from memlayout.load.mapped_files import MappedFiles
from memlayout.load.records import (
    DeclaredTie,
    LoadedSource,
    ModuleRecord,
    PickleGlobal,
    StorageRecord,
    TensorRecord,
)


class StorageSpans(NamedTuple):
    """Where the files hold each storage's bytes, by storage key."""

    starts: dict[str, int]
    """Absolute offset in its file of each storage's byte 0."""
    sizes: dict[str, int]
    """Bytes the file holds for each storage."""
    checksums: dict[str, int] | None = None
    """The CRC-32 the file records for each whole storage, where it records one (zip entries do)."""
    file_of: dict[str, int] | None = None
    """Which of several files holds each storage; None for one file."""


def file_source(
    path: str,
    format: str,
    tensors: list[TensorRecord],
    storages: dict[str, StorageRecord],
    spans: StorageSpans | None,
    *,
    files: Sequence[str] | None = None,
    pickle_globals: Sequence[PickleGlobal] = (),
    modules: Sequence[ModuleRecord] = (),
    declared_ties: Sequence[DeclaredTie] = (),
    legacy_format: bool = False,
    notes: Sequence[str] = (),
    read_in_place: bool = True,
) -> LoadedSource:
    """The `LoadedSource` of records a loader built, with a reader over the file's storages.

    The file is mapped last, after every step that can fail, so a loader that
    raises has nothing open.

    Args:
        path: What the source is reported as (the file or directory).
        format: The format name ("torch-zip", "safetensors", ...).
        tensors: The tensor records.
        storages: The storage records, by key.
        spans: Where each storage's bytes lie; None when the bytes are not located
            (no reader).
        files: The files `spans.file_of` indexes; `[path]` by default.
        pickle_globals: Every global the file's pickles reference.
        modules: The module tree, where the file holds one.
        declared_ties: Ties the file declares.
        legacy_format: The file uses a legacy torch.save format.
        notes: What the user should know that is no finding.
        read_in_place: Map the files for the storage bytes; False for a remote
            file, whose loader attaches a reader of its own.

    Returns:
        The source; close it (or use it as a context manager) when done.
    """
    reader = None
    if spans is not None and read_in_place:
        paths = list(files) if files is not None else [path]
        reader = MappedFiles.open(paths, spans.starts, spans.sizes, spans.file_of, spans.checksums)
    return LoadedSource(
        path=path,
        format=format,
        tensors=tensors,
        storages=storages,
        modules=list(modules),
        declared_ties=list(declared_ties),
        reader=reader,
        pickle_globals=list(pickle_globals),
        legacy_format=legacy_format,
        notes=list(notes),
    )


def pickled_source(
    path: str,
    format: str,
    root: Any,
    spans: StorageSpans | None,
    *,
    pickle_globals: Sequence[PickleGlobal],
    made_placeholders: bool = True,
    used_in_place: bool = True,
    more_tensors: Mapping[str, Any] | None = None,
    legacy_format: bool = False,
    notes: Sequence[str] = (),
    read_in_place: bool = True,
) -> LoadedSource:
    """The `LoadedSource` of a torch pickle read inertly: tensors, storages, modules and ties.

    Every format whose payload is a torch pickle (torch.save zip, legacy and tar
    files, TorchScript, a bare pickle) ends here.

    Args:
        path: The file.
        format: The format name.
        root: The unpickled tree.
        spans: Where the file holds each storage the pickle names; None when the
            format does not locate storage bytes (metadata only, no reader).
        pickle_globals: Every global the pickles reference.
        made_placeholders: Whether the unpickler made any placeholder (without one
            the tree holds no module and is not walked for modules).
        used_in_place: Whether torch uses the storage bytes where they lie in the
            file (a zip under `torch.load(mmap=True)`), so that the file offset is
            each storage's base address; False where torch copies them out.
        more_tensors: Further trees whose tensors count too, by the name that
            prefixes them (TorchScript's {"constants": ...}); their modules do not.
        legacy_format: The file uses a legacy torch.save format.
        notes: What the user should know that is no finding.
        read_in_place: Map the file for the storage bytes (False for a remote file).

    Returns:
        The source; close it (or use it as a context manager) when done.

    Raises:
        CorruptCheckpointError: the pickle names a storage the file lacks, or a
            tensor with an impossible layout.
    """
    # Only the pickle formats need the pickled tree's walkers, and a safetensors file none.
    from memlayout.load.pickled_tree import modules_and_ties, tensor_records

    starts = spans.starts if spans is not None else None
    sizes = spans.sizes if spans is not None else None
    tensors, storages = tensor_records(root, starts, sizes, path, used_in_place)
    if more_tensors:
        extra_tensors, extra_storages = tensor_records(dict(more_tensors), starts, sizes, path, used_in_place)
        tensors += extra_tensors
        storages.update(extra_storages)
    modules, ties = modules_and_ties(root, tensors, made_placeholders)
    return file_source(
        path, format, tensors, storages, spans,
        pickle_globals=pickle_globals, legacy_format=legacy_format, notes=notes,
        modules=modules, declared_ties=ties, read_in_place=read_in_place,
    )
