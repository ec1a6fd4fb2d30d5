"""Hugging Face model directories: config.json plus weights, single or sharded.

Weights are found the way `from_pretrained` looks for them, safetensors first:
`model.safetensors.index.json` (shards), `model.safetensors`,
`pytorch_model.bin.index.json` (shards), `pytorch_model.bin`. Tensor names are
the state-dict keys; a shard only decides where the bytes live.

Tie intent comes from config.json, read by `hf_ties`, and ML103 compares the
tensors it declares tied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memlayout.errors import CorruptCheckpointError, UnrecognizedFormatError
from memlayout.load import detect, load_path
from memlayout.load.file_source import StorageSpans, file_source
from memlayout.load.hf_ties import declared_ties
from memlayout.load.records import (
    DeclaredTie,
    LoadedSource,
    StorageReader,
    StorageRecord,
    TensorRecord,
)
from memlayout.load.safetensors_file import (
    SafetensorsHeader,
    metadata_ties,
    read_header,
    safetensors_records,
)

CONFIG = "config.json"
SAFETENSORS_INDEX = detect.HF_SAFETENSORS_INDEX
SAFETENSORS_SINGLE = detect.HF_SAFETENSORS_SINGLE
BIN_INDEX = detect.HF_BIN_INDEX
BIN_SINGLE = detect.HF_BIN_SINGLE
WEIGHT_FILES = detect.HF_WEIGHT_FILES

def is_hf_dir(path: str) -> bool:
    """Whether a directory holds Hugging Face weights by their standard file names.

    Args:
        path: A directory.

    Returns:
        True when one of the standard weight files or index files is present.
    """
    return detect.is_hf_dir(path, b"")


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptCheckpointError(f"{path}: the {what} is not readable JSON ({exc})") from exc


def _index_shards(directory: str, index_name: str) -> dict[str, list[str]]:
    """shard file -> tensor names, in the index's order; every shard must exist."""
    index_path = os.path.join(directory, index_name)
    shards = index_shards(_read_json(index_path, "index"), index_path)
    for shard in shards:
        if not os.path.isfile(os.path.join(directory, shard)):
            raise CorruptCheckpointError(
                f"{index_path} names shard {shard}, which is missing",
                "download or copy every shard the index lists into the directory",
            )
    return shards


def index_shards(index: Any, index_path: str) -> dict[str, list[str]]:
    """shard file -> tensor names of a parsed index, in its order; no shard may leave the directory.

    Args:
        index: The index file's JSON.
        index_path: Where it was read from, for messages (a path or a URL).

    Returns:
        Each shard's tensor names.

    Raises:
        CorruptCheckpointError: no weight_map, or a shard outside the model directory.
    """
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(f"{index_path} has no weight_map of tensor name -> shard file")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    for shard in shards:
        # A shard outside the directory would let an index read arbitrary files (or URLs).
        if os.path.isabs(shard) or ".." in shard.replace("\\", "/").split("/") or "://" in shard:
            raise CorruptCheckpointError(f"{index_path} names shard {shard!r} outside the model directory")
    return shards


@dataclass
class ShardedReader:
    """Dispatches storage reads to each shard's own reader."""

    readers: dict[str, tuple[StorageReader, str]]
    """merged storage key -> (the shard's reader, the shard's key)."""
    shards: list[LoadedSource] = field(default_factory=list)
    """Each shard as loaded; `close` closes them all."""

    def close(self) -> None:
        """Close every shard's files."""
        for shard in self.shards:
            shard.close()

    def read(self, storage_key: str, start: int, length: int) -> bytes | memoryview:
        """Return `length` bytes of storage `storage_key` from byte `start`.

        Args:
            storage_key: The merged key (`shard:key` for pickled shards).
            start: Byte offset in the storage.
            length: Bytes to read.

        Returns:
            The bytes, zero-copy where the shard's reader allows it.
        """
        reader, key = self.readers[storage_key]
        return reader.read(key, start, length)

    def read_into(self, storage_key: str, start: int, buffer: memoryview) -> None:
        """Copy bytes into `buffer`, through the shard's own `read_into` when it has one."""
        reader, key = self.readers[storage_key]
        read_into = getattr(reader, "read_into", None)
        if read_into is not None:
            read_into(key, start, buffer)
        else:
            buffer[:] = reader.read(key, start, len(buffer))

    def release(self, storage_key: str, start: int, length: int) -> None:
        """Give mapped pages back through the shard's reader, so a deep scan stays bounded."""
        reader, key = self.readers[storage_key]
        release = getattr(reader, "release", None)
        if release is not None:
            release(key, start, length)

    def checksum(self, storage_key: str, start: int, length: int) -> int | None:
        """The shard's recorded CRC-32 of these bytes, where its format keeps one."""
        reader, key = self.readers[storage_key]
        checksum = getattr(reader, "checksum", None)
        return checksum(key, start, length) if checksum is not None else None


def _load_safetensors_shards(directory: str, shards: list[str]) -> LoadedSource:
    paths = [os.path.join(directory, shard) for shard in shards]
    headers = [read_header(path)[0] for path in paths]
    return safetensors_shards_source(directory, shards, headers, paths)[0]


def safetensors_shards_source(
    directory: str, shards: list[str], headers: list[SafetensorsHeader], paths: list[str],
    read_in_place: bool = True,
) -> tuple[LoadedSource, StorageSpans]:
    """One source over the headers of a model's safetensors shards, and where each storage lies.

    Args:
        directory: The model directory (or its URL), as reported.
        shards: Each shard's file name, in the order of `headers`.
        headers: Each shard's validated header.
        paths: Each shard's path (or URL).
        read_in_place: Map the shards for their bytes (False for remote shards).

    Returns:
        The source, and its storages' spans, whose `file_of` indexes `paths`.

    Raises:
        CorruptCheckpointError: a tensor name appears in two shards.
    """
    tensors: list[TensorRecord] = []
    storages: dict[str, StorageRecord] = {}
    starts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    file_of: dict[str, int] = {}
    names: set[str] = set()
    for index, (shard, header) in enumerate(zip(shards, headers, strict=True)):
        shard_tensors, shard_storages, shard_spans = safetensors_records(header, shard)
        duplicates = names & {t.name for t in shard_tensors}
        if duplicates:
            raise CorruptCheckpointError(f"{directory}: tensor {sorted(duplicates)[0]} appears in more than one shard")
        names.update(t.name for t in shard_tensors)
        tensors += shard_tensors
        storages.update((key, storage._replace(file=shard)) for key, storage in shard_storages.items())
        for key, start in shard_spans.starts.items():
            starts[key], sizes[key], file_of[key] = start, shard_spans.sizes[key], index
    ties = [tie for header in headers for tie in metadata_ties(header, names)]
    spans = StorageSpans(starts, sizes, file_of=file_of)
    source = file_source(
        directory, "hf-safetensors", tensors, storages, spans, files=paths, declared_ties=ties,
        read_in_place=read_in_place,
    )
    return source, spans


def _load_pickled_shards(directory: str, shards: list[str]) -> LoadedSource:
    return pickled_shards_source(directory, shards, lambda shard: load_path(os.path.join(directory, shard)))


def pickled_shards_source(
    directory: str, shards: list[str], load_shard: Callable[[str], LoadedSource]
) -> LoadedSource:
    """One source over a model's torch.save shards, each loaded by `load_shard(file name)`.

    Args:
        directory: The model directory (or its URL), as reported.
        shards: The shard file names.
        load_shard: Loads one shard (from disk, or by its URL).

    Returns:
        The merged source, whose reader dispatches to each shard's.
    """
    merged = LoadedSource(directory, "hf-pytorch", [], {})
    readers: dict[str, tuple[StorageReader, str]] = {}
    shard_sources: list[LoadedSource] = []
    try:
        for shard in shards:
            source = load_shard(shard)
            shard_sources.append(source)
            # Storage keys restart at "0" in every shard; prefix them to keep them apart.
            prefix = f"{shard}:" if len(shards) > 1 else ""
            for record in source.tensors:
                merged.tensors.append(record._replace(storage_key=prefix + record.storage_key))
            for key, storage in source.storages.items():
                merged.storages[prefix + key] = storage._replace(key=prefix + key, file=shard)
                if source.reader is not None:
                    readers[prefix + key] = (source.reader, key)
            merged.modules += source.modules
            merged.pickle_globals += [g for g in source.pickle_globals if g not in merged.pickle_globals]
            merged.legacy_format |= source.legacy_format
            merged.notes += source.notes
    except BaseException:
        for source in shard_sources:
            source.close()
        raise
    merged.reader = ShardedReader(readers, shard_sources)
    return merged


def config_ties(path: str, names: list[str], stored: list[str] | None = None) -> list[DeclaredTie]:
    """The ties a model directory's config.json declares for any of `names`, stored or not.

    The loader declares ties among the tensors a directory stores. A comparison
    also needs the names the directory does not store but its config restores on
    load (`save_pretrained` writes `transformer.wte.weight` and drops the tied
    `lm_head.weight`), so it asks again with the other side's names.

    Args:
        path: The model directory.
        names: Candidate tensor names, e.g. the stored ones plus another checkpoint's.
        stored: The names the directory stores: a tie's kept end is one of them.

    Returns:
        `declared_ties(config, names, stored=stored)`; empty without a readable config.json.
    """
    config_path = os.path.join(path, CONFIG)
    if not os.path.isfile(config_path):
        return []
    config = _read_json(config_path, "model config")
    return declared_ties(config, names, stored=stored) if isinstance(config, dict) else []


def weight_files(path: str) -> tuple[list[str], bool]:
    """The weight files of a model directory, as the loader reads them.

    safetensors wins over pytorch_model.bin, and an index over a single file, as in
    transformers' own loading order.

    Args:
        path: The model directory.

    Returns:
        (file names relative to `path`, whether they are torch.save pickles).

    Raises:
        CorruptCheckpointError: an index names a missing shard.
        UnrecognizedFormatError: no standard weight file is present.
    """
    if os.path.isfile(os.path.join(path, SAFETENSORS_INDEX)):
        return list(_index_shards(path, SAFETENSORS_INDEX)), False
    if os.path.isfile(os.path.join(path, SAFETENSORS_SINGLE)):
        return [SAFETENSORS_SINGLE], False
    if os.path.isfile(os.path.join(path, BIN_INDEX)):
        return list(_index_shards(path, BIN_INDEX)), True
    if os.path.isfile(os.path.join(path, BIN_SINGLE)):
        return [BIN_SINGLE], True
    raise UnrecognizedFormatError(f"{path} has none of {', '.join(WEIGHT_FILES)}")


def load_hf_dir(path: str) -> LoadedSource:
    """Read a Hugging Face model directory as layout records.

    Args:
        path: A directory holding config.json and model weights.

    Returns:
        One `LoadedSource` over every shard, with the ties config.json declares.

    Raises:
        CorruptCheckpointError: an index names a missing shard, or a file is damaged.
        UnrecognizedFormatError: no standard weight file is present.
    """
    files, pickled = weight_files(path)
    source = _load_pickled_shards(path, files) if pickled else _load_safetensors_shards(path, files)
    # The index of the kind weight_files chose was read whenever it exists.
    index = BIN_INDEX if pickled else SAFETENSORS_INDEX
    source.files = tuple(sorted({*files, CONFIG, *([index] if os.path.isfile(os.path.join(path, index)) else [])}))
    config_path = os.path.join(path, CONFIG)
    if os.path.isfile(config_path):
        try:
            config = _read_json(config_path, "model config")
        except BaseException:
            source.close()
            raise
        if isinstance(config, dict):
            source.declared_ties += declared_ties(config, [t.name for t in source.tensors])
    else:
        source.notes.append(f"{path} has no {CONFIG}: no tie intent is known")
    return source
