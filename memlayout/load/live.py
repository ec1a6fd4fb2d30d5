"""Live torch objects: an nn.Module, a state dict, or a nested training checkpoint.

The only loader that imports torch, and only because the caller already holds
torch objects. Storage identity is torch's own storage pointer, keyed with the
device so that equal addresses on two devices never merge.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.errors import UsageError
from memlayout.load.records import (
    DeclaredTie,
    LoadedSource,
    ModuleRecord,
    RnnRecord,
    ShardRecord,
    StorageRecord,
    TensorKind,
    TensorRecord,
    section_of,
)

if TYPE_CHECKING:
    import torch


@dataclass
class LiveStorageReader:
    """Reads bytes of live storages, copying to the host only the range asked for."""

    storages: dict[str, Any]

    def read(self, storage_key: str, start: int, length: int) -> memoryview:
        import torch

        storage = self.storages[storage_key]
        as_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device)
        as_bytes.set_(storage, 0, (storage.nbytes(),), (1,))
        chunk = as_bytes[start : start + length]
        if chunk.device.type != "cpu":
            chunk = chunk.cpu()
        return memoryview(chunk.numpy().data)


def storage_key(tensor: torch.Tensor) -> str:
    """The key of a live tensor's storage: its device and torch's storage identity.

    The one place this key is built: flatten finds a live tensor's planned slot by it.
    The device is part of it, so that equal addresses on two devices never merge.
    """
    return f"{tensor.device}:{_torch.storage_id(tensor.untyped_storage()):#x}"


def _loaded_class(module: str, name: str) -> Any:
    """A class from a torch.distributed module, if something already imported it.

    A model holds a DTensor or an FSDP2 module only if their modules were imported
    to make it, so a model that never touched torch.distributed costs no import.
    """
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def _fsdp_prefixes(module: Any) -> list[str]:
    """Paths of the modules `fully_shard` was applied to ("" for the root); empty without FSDP2."""
    fsdp_module = _loaded_class("torch.distributed.fsdp", "FSDPModule")
    if fsdp_module is None:
        return []
    return [path for path, sub in module.named_modules() if isinstance(sub, fsdp_module)]


def _under(name: str, prefixes: list[str]) -> bool:
    return any(prefix == "" or name.startswith(prefix + ".") for prefix in prefixes)


class _Collector:
    def __init__(self) -> None:
        self.tensors: list[TensorRecord] = []
        self.storages: dict[str, StorageRecord] = {}
        self.raw_storages: dict[str, Any] = {}
        self.modules: list[ModuleRecord] = []
        self.ties: list[DeclaredTie] = []
        self.shards: list[ShardRecord] = []
        self.mesh_size = 1
        self.dtensor = _loaded_class("torch.distributed.tensor", "DTensor")

    def _local_piece(self, name: str, tensor: Any, fsdp: bool) -> Any:
        """The local piece of a DTensor, recorded with where it sits in the whole tensor."""
        local = tensor.to_local().detach()
        mesh = tensor.device_mesh
        self.mesh_size = max(self.mesh_size, mesh.size())
        offset = _torch.dtensor_global_offset(tensor)
        padding = 0
        if fsdp:
            # FSDP2 keeps each rank's piece as a view of a buffer padded to the largest piece.
            used = (local.storage_offset() + local.numel()) * local.element_size()
            padding = max(local.untyped_storage().nbytes() - used, 0)
        self.shards.append(
            ShardRecord(
                name=name,
                placements=tuple(repr(p) for p in tensor.placements),
                mesh_shape=tuple(mesh.shape),
                global_shape=tuple(tensor.shape),
                local_shape=tuple(local.shape),
                global_offset=offset,
                fsdp=fsdp,
                padding_bytes=padding,
                storage_key=storage_key(local),
                itemsize=local.element_size(),
            )
        )
        return local

    def add(
        self, name: str, tensor: torch.Tensor, kind: TensorKind, optimizer_state: bool = False, section: str = "",
        fsdp: bool = False,
    ) -> None:
        import torch

        if self.dtensor is not None and isinstance(tensor, self.dtensor):
            tensor = self._local_piece(name, tensor, fsdp)
        if tensor.layout != torch.strided:
            # Sparse and other layouts have no single (storage, offset, stride) view.
            return
        storage = tensor.untyped_storage()
        device = str(tensor.device)
        key = storage_key(tensor)
        if key not in self.storages:
            has_data = tensor.device.type != "meta" and storage.data_ptr() != 0
            self.storages[key] = StorageRecord(
                key, device, storage.nbytes(), storage.data_ptr() if has_data else None, has_data
            )
            if has_data:
                self.raw_storages[key] = storage
        on_cpu = tensor.device.type == "cpu"
        self.tensors.append(
            TensorRecord(
                name=name,
                kind=kind,
                dtype=str(tensor.dtype).removeprefix("torch."),
                shape=tuple(tensor.shape),
                stride=tuple(tensor.stride()),
                storage_key=key,
                offset=int(tensor.storage_offset()),
                requires_grad=tensor.requires_grad,
                object_id=id(tensor),
                optimizer_state=optimizer_state,
                section=section,
                pinned=tensor.is_pinned() if on_cpu else None,
                # Asked of the untyped storage: Tensor.is_shared() builds a TypedStorage
                # first, which costs more than the rest of the record (benchmarks/README.md).
                shared_memory=bool(tensor.untyped_storage().is_shared()) if on_cpu else None,
            )
        )

    def add_module(self, module: torch.nn.Module, prefix: str, section: str = "") -> None:
        import torch

        dot = f"{prefix}." if prefix else ""
        wrapped = _fsdp_prefixes(module)
        for name, param in module.named_parameters(remove_duplicate=False):
            self.add(dot + name, param, TensorKind.PARAMETER, section=section, fsdp=_under(name, wrapped))
        for name, buffer in module.named_buffers(remove_duplicate=False):
            self.add(dot + name, buffer, TensorKind.BUFFER, section=section)
        for path, sub in module.named_modules(remove_duplicate=False):
            full = f"{dot}{path}" if path else prefix
            cls = type(sub)
            rnn = None
            if isinstance(sub, torch.nn.RNNBase):
                rnn = self._rnn(sub, f"{full}." if full else "", section)
            self.modules.append(ModuleRecord(full, f"{cls.__module__}.{cls.__qualname__}", rnn))
        self.ties.extend(declared_ties(module, dot))

    def _rnn(self, rnn: torch.nn.RNNBase, dot: str, section: str) -> RnnRecord:
        import torch

        names = tuple(_torch.rnn_flat_weight_names(rnn))
        registered = {name for name, _ in rnn.named_parameters(recurse=False)}
        unregistered = []
        for name in names:
            if name not in registered:
                unregistered.append(dot + name)
                # The weight-dropout pattern: the weight is a plain attribute that is
                # recomputed each forward. Record it so its layout is still checked.
                value = rnn.__dict__.get(name)
                if isinstance(value, torch.Tensor):
                    self.add(dot + name, value, TensorKind.TENSOR, section=section)
        return RnnRecord(
            rnn.mode, tuple(dot + n for n in names), tuple(unregistered),
            known_from="live", weights_replaced=_torch.rnn_weights_replaced(rnn),
        )

    def walk(self, obj: Any, prefix: str, in_optimizer: bool, section: str = "") -> None:
        import torch

        if isinstance(obj, torch.nn.Module):
            self.add_module(obj, prefix, section)
        elif isinstance(obj, torch.Tensor):
            kind = TensorKind.PARAMETER if isinstance(obj, torch.nn.Parameter) else TensorKind.TENSOR
            self.add(prefix, obj, kind, in_optimizer, section)
        elif isinstance(obj, (dict, list, tuple)):
            if isinstance(obj, dict):
                in_optimizer = in_optimizer or {"state", "param_groups"} <= obj.keys()
                items: Any = obj.items()
            else:
                items = enumerate(obj)
            for key, value in items:
                child_section = section_of(prefix, key, isinstance(value, torch.Tensor), section)
                self.walk(value, f"{prefix}.{key}" if prefix else str(key), in_optimizer, child_section)


def declared_ties(module: Any, dot: str = "") -> list[DeclaredTie]:
    """Ties a Hugging Face model declares, read from the model and its config.

    transformers 5 maps target -> source in `all_tied_weights_keys` (already
    filtered by the config); transformers 4 lists targets in `_tied_weights_keys`,
    all tied to the input embeddings when `tie_word_embeddings` is set.
    """
    config = getattr(module, "config", None)
    mapping = getattr(module, "all_tied_weights_keys", None)
    if isinstance(mapping, dict):
        return [
            DeclaredTie(dot + str(target), dot + str(source), f"{type(module).__name__}.all_tied_weights_keys")
            for target, source in mapping.items()
        ]
    keys = getattr(module, "_tied_weights_keys", None)
    if not keys or config is None or not getattr(config, "tie_word_embeddings", False):
        return []
    if isinstance(keys, dict):
        return [
            DeclaredTie(dot + str(t), dot + str(s), f"{type(module).__name__}._tied_weights_keys")
            for t, s in keys.items()
        ]
    get_input = getattr(module, "get_input_embeddings", None)
    embeddings = get_input() if callable(get_input) else None
    weight = getattr(embeddings, "weight", None)
    source = next((name for name, p in module.named_parameters() if p is weight), None)
    if source is None:
        return []
    return [
        DeclaredTie(dot + str(target), dot + source, "config.tie_word_embeddings")
        for target in keys
        if str(target) != source
    ]


def load_live(obj: Any, path: str | None = None) -> LoadedSource:
    """Records for a live nn.Module, state dict, tensor container or nested checkpoint.

    Args:
        obj: The object; modules anywhere inside containers are walked as modules.
        path: What to report as the source (an import spec, say).

    Returns:
        A `LoadedSource` whose reader reads the live storages.

    Raises:
        UsageError: the object holds no tensors at all.
    """
    import torch

    collector = _Collector()
    collector.walk(obj, "", False)
    if not collector.tensors and not isinstance(obj, (torch.nn.Module, dict)):
        raise UsageError(f"{type(obj).__name__} holds no tensors", "pass an nn.Module or a state dict")
    fmt = "live-module" if isinstance(obj, torch.nn.Module) else "state-dict"
    rank, world_size = 0, collector.mesh_size
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        rank, world_size = distributed.get_rank(), distributed.get_world_size()
    return LoadedSource(
        shards=collector.shards,
        rank=rank,
        world_size=world_size,
        path=path,
        format=fmt,
        tensors=collector.tensors,
        storages=collector.storages,
        modules=collector.modules,
        declared_ties=collector.ties,
        reader=LiveStorageReader(collector.raw_storages),
        live_object=obj,
    )
