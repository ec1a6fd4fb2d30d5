"""torch.export `.pt2` archives, read from their JSON configs alone.

Since torch 2.6, `torch.export.save` writes a zip whose weights are described in
`<archive>/data/weights/model_weights_config.json` (and lifted constants in
`data/constants/model_constants_config.json`): per tensor, the record holding its
storage (`path_name`; tied or viewing tensors share one), dtype, sizes, strides,
storage offset, device and whether it is a parameter. Each record is raw storage
bytes, so a clean read needs no unpickling and no torch: that is what this does.
The graph itself (`models/*.json`) is not needed for layout.

Not read, and said so: archives from older torch (a pickled
`serialized_state_dict.pt` instead of the JSON configs) and tensors stored with
`use_pickle` (tensor subclasses), whose bytes are a torch.save pickle; those get
metadata without data. Symbolic sizes (`as_expr`) cannot occur in saved weights.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Any

from memlayout.dtypes import dtype_info
from memlayout.errors import CorruptCheckpointError, UnrecognizedFormatError
from memlayout.load.mapped_files import MappedFiles, Span
from memlayout.load.records import LoadedSource, StorageRecord, TensorKind, TensorRecord
from memlayout.load.torchscript import central_directory, record_spans

WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
# torch/_export/serde/schema.py ScalarType values.
SCALAR_TYPES: dict[int, str] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16",
    28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32", 35: "uint64",
}
# zlib.error: a damaged deflated member fails inside zipfile's decompressor.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, KeyError, NotImplementedError)


def is_pt2_zip(path: str) -> bool:
    """Whether a zip is a torch.export archive.

    Args:
        path: A file that starts like a zip.

    Returns:
        True when the directory lists `<archive>/archive_format` or a weights config.
    """
    directory = central_directory(path)
    return b"/archive_format" in directory or WEIGHTS_CONFIG.encode() in directory


def _int(value: Any, what: str) -> int:
    if isinstance(value, dict) and isinstance(value.get("as_int"), int):
        return int(value["as_int"])
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise CorruptCheckpointError(f"the .pt2 weights config has {what} {value!r:.60}; expected a concrete int")


def _device(meta: dict[str, Any]) -> str:
    device = meta.get("device") or {}
    kind = str(device.get("type") or "cpu")
    index = device.get("index")
    return f"{kind}:{index}" if index is not None else kind


def _entries(
    path: str, config: Any, folder: str, kind_of: Any
) -> list[tuple[str, str, bool, dict[str, Any], TensorKind]]:
    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        raise CorruptCheckpointError(f"{path}: {folder} config has no 'config' object")
    entries = []
    for name, entry in config["config"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("tensor_meta"), dict):
            raise CorruptCheckpointError(f"{path}: {folder} entry {name!r} has no tensor_meta")
        entries.append((str(name), f"{folder}/{entry.get('path_name')}", bool(entry.get("use_pickle")),
                        entry["tensor_meta"], kind_of(entry)))
    return entries


def load_pt2(path: str) -> LoadedSource:
    """Read a torch.export archive's weights as layout records, without unpickling.

    Args:
        path: The .pt2 file.

    Returns:
        A `LoadedSource` with one storage per weight record (shared by ties and views).

    Raises:
        UnrecognizedFormatError: an older archive layout that only pickles describe.
        CorruptCheckpointError: the zip or a config is damaged.
    """
    with open(path, "rb") as handle:
        try:
            archive = zipfile.ZipFile(handle)
            names = archive.namelist()
            configs = [n for n in names if n.endswith("/" + WEIGHTS_CONFIG)]
            if not configs:
                raise UnrecognizedFormatError(
                    f"{path} is a torch.export archive without {WEIGHTS_CONFIG}: an older layout that "
                    "describes its weights only in pickles, which memlayout will not execute",
                    "re-export it with torch>=2.6 (torch.export.save), or save the state dict as safetensors",
                )
            prefix = configs[0][: -len(WEIGHTS_CONFIG)]
            weights = json.loads(archive.read(configs[0]))
            constants_name = prefix + CONSTANTS_CONFIG
            constants = json.loads(archive.read(constants_name)) if constants_name in names else {"config": {}}
            file_size = os.fstat(handle.fileno()).st_size
            starts, sizes = record_spans(file_size, archive, f"{prefix}data/")
        except _ZIP_ERRORS as exc:
            raise CorruptCheckpointError(f"{path} is not a readable torch.export archive: {exc}") from exc
    reader = MappedFiles.open([path])
    reader.spans = {key: Span(0, start, sizes[key]) for key, start in starts.items()}
    try:
        entries = _entries(
            path, weights, "weights",
            lambda e: TensorKind.PARAMETER if e.get("is_param") else TensorKind.BUFFER,
        ) + _entries(path, constants, "constants", lambda e: TensorKind.TENSOR)
        tensors: list[TensorRecord] = []
        storages: dict[str, StorageRecord] = {}
        notes = []
        for name, key, pickled, meta, kind in entries:
            dtype = SCALAR_TYPES.get(meta.get("dtype", 0))
            if dtype is None:
                raise CorruptCheckpointError(f"{path}: tensor {name} has unknown dtype code {meta.get('dtype')!r}")
            shape = tuple(_int(v, f"size of {name}") for v in meta.get("sizes") or [])
            stride = tuple(_int(v, f"stride of {name}") for v in meta.get("strides") or [])
            offset = _int(meta.get("storage_offset", 0), f"storage offset of {name}")
            if pickled:
                # The record is a torch.save pickle of a tensor subclass, not raw bytes.
                key = f"{key}#pickled"
                notes.append(f"{name} is stored pickled (a tensor subclass); its contents are not read")
            if key not in storages:
                if pickled:
                    nbytes = (offset + sum((s - 1) * st for s, st in zip(shape, stride, strict=False)) + 1) * dtype_info(dtype).itemsize
                    storages[key] = StorageRecord(key, _device(meta), nbytes if all(shape) else 0, None, has_data=False)
                else:
                    if key not in sizes:
                        raise CorruptCheckpointError(f"{path}: tensor {name} names record {key}, which the archive lacks")
                    storages[key] = StorageRecord(key, _device(meta), sizes[key], starts[key])
            tensors.append(
                TensorRecord(name, kind, dtype, shape, stride, key, offset, requires_grad=bool(meta.get("requires_grad")))
            )
    except BaseException:
        reader.close()
        raise
    return LoadedSource(
        path=path, format="torch-export", tensors=tensors, storages=storages, reader=reader, notes=notes,
        close=reader.close,
    )
