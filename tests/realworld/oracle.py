"""What torch itself says a checkpoint holds: the independent side of every corpus comparison.

Each file is opened with the loader its users call (`torch.load`, `torch.jit.load`,
`safetensors.safe_open`, `torch.export.load`, DCP's metadata reader), never with
memlayout's code, and reduced to one record per tensor name: dtype, shape,
stride, storage offset, which storage it shares, where its data lands in memory,
and the device the file names. Module pickles are read with torch's own
unpickler, with the classes of other projects replaced by inert stand-ins, so
that no code from the file runs and no project has to be installed.
"""

from __future__ import annotations

import pickle
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Modules whose classes the stand-in unpickler builds for real: torch and the
# containers its pickles use. Anything else (a project's own model classes) becomes
# an inert object that keeps its pickled state.
_REAL_MODULE_PREFIXES = ("torch", "collections", "builtins", "__builtin__", "_codecs", "copyreg", "numpy")


@dataclass(frozen=True)
class TorchTensor:
    """One tensor as torch's own loader gives it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage: int
    """Identifies the storage (a data pointer, or the mapping for safetensors)."""
    data_address: int
    """Where element 0 lands in memory, as the loader hands it out."""
    nbytes: int
    device: str
    """The device the file names for this tensor's storage."""
    tensor: torch.Tensor | None = None


class _StandIn:
    """An inert stand-in for a class outside torch: it keeps the state it is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
            self.__dict__.update(state[0])


class _StandInUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in _REAL_MODULE_PREFIXES:
            return super().find_class(module, name)
        return type(name, (_StandIn,), {"__module__": module})


_STAND_INS = types.SimpleNamespace(
    __name__="stand_in_pickle",
    Unpickler=_StandInUnpickler,
    load=lambda file, **kwargs: _StandInUnpickler(file, **kwargs).load(),
)


def _walk(node: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    def join(key: Any) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    if isinstance(node, torch.Tensor):
        yield prefix, node
        return
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, torch.nn.Module) or (isinstance(node, _StandIn) and "_parameters" in node.__dict__):
        state = node.__dict__
        for holder in ("_parameters", "_buffers"):
            for key, value in (state.get(holder) or {}).items():
                if isinstance(value, torch.Tensor):
                    yield join(key), value
        for key, child in (state.get("_modules") or {}).items():
            yield from _walk(child, join(key), seen)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, join(key), seen)
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _walk(value, join(index), seen)


def _records(named: Iterator[tuple[str, torch.Tensor]], devices: dict[int, str]) -> dict[str, TorchTensor]:
    found: dict[str, TorchTensor] = {}
    for name, tensor in named:
        storage = tensor.untyped_storage()
        found[name] = TorchTensor(
            name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tuple(tensor.stride()),
            tensor.storage_offset(), storage.data_ptr(), tensor.data_ptr(), tensor.numel() * tensor.element_size(),
            devices.get(storage.data_ptr(), str(tensor.device)), tensor,
        )
    return found


def _torch_load(path: Path, mmap: bool) -> tuple[Any, dict[int, str]]:
    """torch.load's tree, on the CPU, and the device the file names for each storage."""
    locations: dict[int, str] = {}

    def record(storage: Any, location: str) -> Any:
        locations[storage.data_ptr()] = location
        return storage

    try:
        tree = torch.load(path, map_location=record, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        # A pickled module of another project: torch's unpickler, that project's classes stood in.
        locations.clear()
        tree = torch.load(path, map_location=record, weights_only=False, mmap=mmap, pickle_module=_STAND_INS)
    return tree, locations


def torch_view(path: Path, fmt: str) -> dict[str, TorchTensor]:
    """Every tensor of `path` as torch's loader for format `fmt` gives it, by memlayout-style dotted name.

    Args:
        path: The checkpoint.
        fmt: memlayout's name for its format, which picks the loader users call.

    Returns:
        name -> record.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fmt == "torch-zip":
            tree, devices = _torch_load(path, mmap=True)
            return _records(_walk(tree, "", set()), devices)
        if fmt in ("torch-legacy", "torch-legacy-tar"):
            tree, devices = _torch_load(path, mmap=False)
            return _records(_walk(tree, "", set()), devices)
        if fmt == "torchscript":
            module = torch.jit.load(str(path), map_location="cpu")
            named = dict(module.named_parameters()) | dict(module.named_buffers())
            return _records(iter(named.items()), {})
        if fmt == "safetensors":
            return _safetensors_view([path])
        if fmt == "hf-safetensors":
            return _safetensors_view(sorted(path.glob("*.safetensors")))
        if fmt == "hf-pytorch":
            found: dict[str, TorchTensor] = {}
            for shard in sorted(path.glob("*.bin")):
                tree, devices = _torch_load(shard, mmap=True)
                found |= _records(_walk(tree, "", set()), devices)
            return found
        if fmt == "torch-export":
            program = torch.export.load(path)
            named = {**program.state_dict, **program.constants}
            return _records(((k, v) for k, v in named.items() if isinstance(v, torch.Tensor)), {})
    raise ValueError(f"no torch loader for {fmt}")


def _safetensors_view(paths: list[Path]) -> dict[str, TorchTensor]:
    from safetensors import safe_open

    found: dict[str, TorchTensor] = {}
    for path in paths:
        with safe_open(str(path), "pt") as opened:
            tensors = {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118
        # safe_open maps the file once; a tensor's storage is its slice of that mapping,
        # so the mapping is the storage and the pointer difference is the offset.
        base = min((t.data_ptr() for t in tensors.values() if t.numel()), default=0)
        for name, tensor in tensors.items():
            offset_bytes = tensor.data_ptr() - base
            found[name] = TorchTensor(
                name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tuple(tensor.stride()),
                offset_bytes // tensor.element_size(), hash(str(path)), tensor.data_ptr(),
                tensor.numel() * tensor.element_size(), "cpu", tensor,
            )
    return found


def dcp_view(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, global shape), from DCP's own metadata reader."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(path)).read_metadata()
    return {
        name: (str(entry.properties.dtype).removeprefix("torch."), tuple(entry.size))
        for name, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }


def storage_groups(tensors: dict[str, TorchTensor]) -> set[frozenset[str]]:
    """Which names share a storage, as a partition of the names."""
    by_storage: dict[int, set[str]] = {}
    for record in tensors.values():
        by_storage.setdefault(record.storage, set()).add(record.name)
    return {frozenset(names) for names in by_storage.values()}
