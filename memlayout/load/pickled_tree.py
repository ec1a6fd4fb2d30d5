"""Turn an inert unpickled object tree into loader records.

Shared by every format whose payload is a torch pickle (zip, legacy, TorchScript
constants), so each only has to say where storage bytes live.
"""

from __future__ import annotations

from typing import Any

from memlayout.load.records import ModuleRecord, RnnRecord, StorageRecord, TensorKind, TensorRecord
from memlayout.load.restricted_pickle import (
    InertObject,
    PickledStorage,
    PickledTensor,
    walk_modules,
    walk_tensors,
)

# torch.nn's RNN classes; a pickled subclass is recognized by its module state
# (`mode` and `_flat_weights_names`), which RNNBase always sets.
_RNN_MODULE = "torch.nn.modules.rnn"


def _meta_storage_key(tensor: PickledTensor) -> str:
    return f"meta:{id(tensor)}"


def tensor_records(
    root: Any, storage_base: dict[str, int] | None = None
) -> tuple[list[TensorRecord], dict[str, StorageRecord]]:
    """Records for every tensor in the tree, and for the storages they view.

    Args:
        root: The unpickled tree.
        storage_base: Byte offset of each storage key in the file, where known.
    """
    tensors: list[TensorRecord] = []
    storages: dict[str, StorageRecord] = {}
    for walked in walk_tensors(root):
        tensor = walked.tensor
        storage: PickledStorage | None = tensor.storage
        if storage is None:
            key = _meta_storage_key(tensor)
            storages[key] = StorageRecord(key, "meta", 0, None, has_data=False)
        else:
            key = storage.key
            if key not in storages:
                base = storage_base.get(key) if storage_base else None
                storages[key] = StorageRecord(
                    key, storage.location, storage.nbytes, base, has_data=storage_base is not None
                )
        if tensor.is_parameter:
            kind = TensorKind.PARAMETER
        elif walked.is_buffer:
            kind = TensorKind.BUFFER
        else:
            kind = TensorKind.TENSOR
        tensors.append(
            TensorRecord(
                name=walked.name,
                kind=kind,
                dtype=tensor.dtype,
                shape=tensor.shape,
                stride=tensor.stride,
                storage_key=key,
                offset=tensor.offset,
                requires_grad=tensor.requires_grad,
                object_id=id(tensor),
                optimizer_state=walked.in_optimizer,
                section=walked.section,
            )
        )
    return tensors, storages


def module_records(root: Any) -> list[ModuleRecord]:
    """The module tree of pickled nn.Modules, with RNN weight layout intent."""
    modules = []
    for path, module in walk_modules(root):
        modules.append(ModuleRecord(path, type(module).qualified_name(), _rnn_record(path, module)))
    return modules


def _rnn_record(path: str, module: InertObject) -> RnnRecord | None:
    state = module.state_dict
    names = state.get("_flat_weights_names")
    mode = state.get("mode")
    if not isinstance(names, list) or not isinstance(mode, str):
        return None
    parameters = state.get("_parameters") or {}
    prefix = f"{path}." if path else ""
    unregistered = tuple(f"{prefix}{n}" for n in names if not isinstance(parameters.get(n), PickledTensor))
    return RnnRecord(mode, tuple(f"{prefix}{n}" for n in names), unregistered)
