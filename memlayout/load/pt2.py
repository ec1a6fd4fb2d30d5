"""torch.export `.pt2` archives, read from their JSON configs or inert pickles.

Recent `torch.export.save` writes a zip whose weights are described in
`<archive>/data/weights/model_weights_config.json` (and lifted constants in
`data/constants/model_constants_config.json`): per tensor, the record holding its
storage (`path_name`; tied or viewing tensors share one), dtype, sizes, strides,
storage offset, device and whether it is a parameter. Each record is raw storage
bytes, so a clean read needs no unpickling and no torch: that is what this does.
The graph itself (`models/*.json`) is not needed for layout.

Older torch (2.1 to 2.7) wrote another layout, which torch.export.load still
reads: a flat zip of `serialized_exported_program.json`, `serialized_state_dict.pt`,
`serialized_constants.pt` (lifted constants and non-persistent buffers),
`serialized_example_inputs.pt` and `version`, where each `.pt` member is the
whole byte stream of a torch.save archive (torch 2.1 named the state dict's
`serialized_state_dict.json`).
`zipfile.ZipFile(f, "w")` stored them uncompressed, so each nested archive is a
byte range of the file: it is read in place by the torch.save zip reader, its
pickle by the restricted unpickler, and its storages are served from the outer
file. Which entries are parameters and buffers comes from the program's graph
signature. A nested archive that was recompressed gets metadata without data.
The example inputs are not weights; their pickle is read only for the globals
it names, as torch.export.load unpickles it too.

Not read, and said so: the first pt2 archives (torch 2.8), which pickled their
weights before the JSON configs existed (pytorch/pytorch#161520), and tensors
stored with `use_pickle` (tensor subclasses), whose bytes are a torch.save
pickle; those get metadata without data. Symbolic sizes (`as_expr`) cannot occur
in saved weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from memlayout.dtypes import dtype_info
from memlayout.errors import CorruptCheckpointError, UnrecognizedFormatError
from memlayout.io.zip_archive import ZipReader, read_recompressed_archive
from memlayout.load.detect import PT2_OLDER_PROGRAM, PT2_WEIGHTS_CONFIG
from memlayout.load.file_source import StorageSpans, file_source
from memlayout.load.pickled_tree import tensor_records
from memlayout.load.records import (
    LoadedSource,
    PickleGlobal,
    StorageRecord,
    TensorKind,
    TensorRecord,
)
from memlayout.load.restricted_pickle import UnpickleResult, unpickle
from memlayout.load.torch_zip import read_torch_zip

WEIGHTS_CONFIG = PT2_WEIGHTS_CONFIG
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
# The older layout's members, at the zip's root. torch.export.load reads the
# `.json` names of torch 2.1 into the same slots as the `.pt` ones.
OLDER_PROGRAM = PT2_OLDER_PROGRAM
OLDER_STATE_DICT = ("serialized_state_dict.pt", "serialized_state_dict.json")
OLDER_CONSTANTS = ("serialized_constants.pt", "serialized_constants.json")
OLDER_EXAMPLE_INPUTS = "serialized_example_inputs.pt"
# torch/_export/serde/schema.py ScalarType values.
SCALAR_TYPES: dict[int, str] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16",
    28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32", 35: "uint64",
}


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
        UnrecognizedFormatError: an archive with neither layout's weights description.
        CorruptCheckpointError: the zip, a config or a nested archive is damaged.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        archive = ZipReader(fd, os.fstat(fd).st_size, 0, path)
        names = archive.names
        configs = [n for n in names if n.endswith("/" + WEIGHTS_CONFIG)]
        if not configs:
            if OLDER_PROGRAM in names or any(name in names for name in OLDER_STATE_DICT):
                try:
                    return _load_older_layout(path, archive)
                except CorruptCheckpointError as exc:
                    if exc.message.startswith(path):
                        raise
                    raise CorruptCheckpointError(
                        f"{path} is not a readable torch.export archive: {exc.message}", exc.hint
                    ) from exc
            raise UnrecognizedFormatError(
                f"{path} is a torch.export archive without {WEIGHTS_CONFIG} or {OLDER_STATE_DICT[0]}, "
                "so memlayout finds no description of its weights",
                "re-export it with torch.export.save, or save the state dict as safetensors",
            )
        prefix = configs[0][: -len(WEIGHTS_CONFIG)]
        constants_name = prefix + CONSTANTS_CONFIG
        try:
            weights = json.loads(archive.read(configs[0]))
            constants = (json.loads(archive.read(constants_name)) if constants_name in archive.by_name
                         else {"config": {}})
            starts, sizes, _ = archive.record_spans(f"{prefix}data/")
        except (CorruptCheckpointError, ValueError) as exc:
            message = exc.message if isinstance(exc, CorruptCheckpointError) else str(exc)
            raise CorruptCheckpointError(f"{path} is not a readable torch.export archive: {message}") from exc
    finally:
        os.close(fd)
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
                nbytes = ((offset + sum((s - 1) * st for s, st in zip(shape, stride, strict=False)) + 1)
                          * dtype_info(dtype).itemsize)
                storages[key] = StorageRecord(key, _device(meta), nbytes if all(shape) else 0, None, has_data=False)
            else:
                if key not in sizes:
                    raise CorruptCheckpointError(f"{path}: tensor {name} names record {key}, which the archive lacks")
                # No base address: torch.export.load copies each record out of the zip
                # (get_storage_from_record) into fresh memory, so the file's alignment is moot.
                storages[key] = StorageRecord(key, _device(meta), sizes[key], None)
        tensors.append(
            TensorRecord(name, kind, dtype, shape, stride, key, offset, requires_grad=bool(meta.get("requires_grad")))
        )
    return file_source(path, "torch-export", tensors, storages, StorageSpans(starts, sizes), notes=notes)


@dataclasses.dataclass(frozen=True)
class _NestedArchive:
    """One torch.save archive found inside the older layout's zip."""

    pickle: UnpickleResult
    starts: dict[str, int] | None
    """Absolute storage offsets in the outer file; None when the member is compressed."""
    sizes: dict[str, int]
    checksums: dict[str, int]


def _read_nested(path: str, archive: ZipReader, member: str) -> _NestedArchive | None:
    """The torch.save archive stored as `member`; None when the member is empty.

    torch.export wrote b"" for an artifact it was told not to serialize, and its
    reader takes that as an empty dict.
    """
    entry = archive.entry(member)
    what = f"{path}: {member}"
    if entry.size == 0:
        return None
    try:
        return _read_nested_member(path, archive, member, what)
    except CorruptCheckpointError as exc:
        # Messages from inside the nested archive name only its own entries.
        if exc.message.startswith(what):
            raise
        raise CorruptCheckpointError(f"{what}: {exc.message}", exc.hint) from exc


def _read_nested_member(path: str, archive: ZipReader, member: str, what: str) -> _NestedArchive:
    entry = archive.entry(member)
    if entry.method == 0:
        # A member running past the end of the file needs no check here: reading the
        # nested archive's end record there comes up short and fails.
        nested = read_torch_zip(archive.file.fd, archive.data_start(entry), entry.size, what)
        return _NestedArchive(nested.pickle, nested.starts, nested.sizes, nested.checksums)
    # Recompressed by some other tool: the storages are no bytes of the file.
    prefix, data, sizes = read_recompressed_archive(path, member, what)
    return _NestedArchive(unpickle(data, what=f"{what}: the pickle {prefix}data.pkl"), None, sizes, {})


def _signature_kinds(path: str, program: bytes) -> dict[str, TensorKind]:
    """state-dict or constant name -> kind, from the program's graph signature.

    A pickled state dict holds parameters as Parameters and buffers as plain
    tensors, but the constants pickle mixes non-persistent buffers with lifted
    constants; only the signature's input specs tell them apart.
    """
    try:
        document = json.loads(program)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"{path}: {OLDER_PROGRAM} is not valid JSON: {exc}") from exc
    signature = (document.get("graph_module") or {}).get("signature") if isinstance(document, dict) else None
    specs = signature.get("input_specs") if isinstance(signature, dict) else None
    kinds: dict[str, TensorKind] = {}
    for spec in specs if isinstance(specs, list) else []:
        if not isinstance(spec, dict):
            continue
        for field, name_key, kind in (
            ("parameter", "parameter_name", TensorKind.PARAMETER),
            ("buffer", "buffer_name", TensorKind.BUFFER),
            ("tensor_constant", "tensor_constant_name", TensorKind.TENSOR),
        ):
            entry = spec.get(field)
            if isinstance(entry, dict) and isinstance(entry.get(name_key), str):
                kinds[entry[name_key]] = kind
    return kinds


def _first_member(names: list[str], candidates: tuple[str, ...]) -> str | None:
    return next((name for name in candidates if name in names), None)


def _load_older_layout(path: str, archive: ZipReader) -> LoadedSource:
    """Read the torch 2.1-2.7 layout: torch.save archives nested in the zip, never executed."""
    names = archive.names
    state_member = _first_member(names, OLDER_STATE_DICT)
    if state_member is None:
        raise CorruptCheckpointError(
            f"{path} is a torch.export archive of the older layout without {OLDER_STATE_DICT[0]}"
        )
    kinds = _signature_kinds(path, archive.read(OLDER_PROGRAM)) if OLDER_PROGRAM in names else {}
    # (storage key label, member); the example inputs are read for their globals only.
    members = [
        ("state_dict", state_member),
        ("constants", _first_member(names, OLDER_CONSTANTS)),
        ("example_inputs", _first_member(names, (OLDER_EXAMPLE_INPUTS,))),
    ]
    tensors: list[TensorRecord] = []
    storages: dict[str, StorageRecord] = {}
    starts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    checksums: dict[str, int] = {}
    pickle_globals: dict[tuple[str, str], PickleGlobal] = {}
    notes = [
        "torch.export archive in the older layout (torch 2.1-2.7): its weights are torch.save archives "
        "inside the zip, which torch.export.load unpickles with weights_only=False if the weights-only load fails"
    ]
    for label, member in members:
        contents = _read_nested(path, archive, member) if member is not None else None
        if contents is None:
            continue
        for found in contents.pickle.globals:
            pickle_globals.setdefault((found.module, found.name), found)
        if label == "example_inputs":
            continue
        records, stored = tensor_records(contents.pickle.root, contents.starts, contents.sizes, f"{path}: {member}")
        if contents.starts is None and records:
            notes.append(f"{member} is compressed inside the zip; its tensors' contents are not read")
        # Both archives number their storages from 0, so keys gain the archive's
        # label. The file offset is no base address: torch.export.load copies each
        # storage out of the zip into fresh memory, so the file's alignment is moot.
        for key, storage in stored.items():
            storages[f"{label}/{key}"] = storage._replace(key=f"{label}/{key}", base_address=None)
            if contents.starts is not None and key in contents.starts:
                starts[f"{label}/{key}"], sizes[f"{label}/{key}"] = contents.starts[key], contents.sizes[key]
                if key in contents.checksums:
                    checksums[f"{label}/{key}"] = contents.checksums[key]
        default = TensorKind.BUFFER if label == "state_dict" else TensorKind.TENSOR
        for record in records:
            kind = kinds.get(record.name)
            if kind is None:
                kind = TensorKind.PARAMETER if record.kind is TensorKind.PARAMETER else default
            tensors.append(record._replace(kind=kind, storage_key=f"{label}/{record.storage_key}"))
    return file_source(
        path, "torch-export", tensors, storages, StorageSpans(starts, sizes, checksums),
        pickle_globals=list(pickle_globals.values()), notes=notes,
    )
