"""Turn an inert unpickled object tree into loader records.

Shared by every format whose payload is a torch pickle (zip, legacy, TorchScript
constants), so each only has to say where storage bytes live.
"""

from __future__ import annotations

from typing import Any

from memlayout.dtypes import dtype_info
from memlayout.errors import CorruptCheckpointError
from memlayout.load.hf_ties import declared_ties
from memlayout.load.pickle_walk import walk_modules, walk_tensors
from memlayout.load.pickled_objects import InertObject, PickledStorage, PickledTensor
from memlayout.load.records import (
    DeclaredTie,
    ModuleRecord,
    RnnRecord,
    StorageRecord,
    TensorKind,
    TensorRecord,
)


def _meta_storage_key(tensor: PickledTensor) -> str:
    return f"meta:{id(tensor)}"


def _geometry_problem(tensor: PickledTensor) -> str | None:
    """What makes a tensor's pickled geometry impossible, or None when it is sound."""
    shape, stride = tensor.shape, tensor.stride
    if len(shape) != len(stride):
        return f"shape {shape!r:.80} and stride {stride!r:.80} differ in length"
    for values, what in ((shape, "shape"), (stride, "stride")):
        if not all(type(v) is int and v >= 0 for v in values):
            return f"{what} {values!r:.80} is not a tuple of non-negative ints"
    return None


def _last_index(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """The element index, from the view's offset, of its last element; -1 for an empty view."""
    if 0 in shape:
        return -1
    return sum((size - 1) * step for size, step in zip(shape, stride, strict=True))


def tensor_records(
    root: Any,
    storage_base: dict[str, int] | None = None,
    storage_size: dict[str, int] | None = None,
    source: str = "the file",
    used_in_place: bool = True,
) -> tuple[list[TensorRecord], dict[str, StorageRecord]]:
    """Records for every tensor in the tree, and for the storages they view.

    Args:
        root: The unpickled tree.
        storage_base: Byte offset of each storage key in the file; None when the
            format does not locate storage bytes (metadata only).
        storage_size: Bytes each storage record holds in the file, where known.
        source: The file, for error messages.
        used_in_place: Whether torch uses the storage bytes where they lie in the
            file (a zip under `torch.load(mmap=True)`), so that the file offset is
            the storage's base address. False for formats whose loader copies each
            storage into fresh memory (legacy torch.save, TorchScript).

    Raises:
        CorruptCheckpointError: the pickle names a storage the file lacks, or one
            bigger than its record.
    """
    tensors: list[TensorRecord] = []
    storages: dict[str, StorageRecord] = {}
    # A damaged or hostile pickle can rebuild a tensor from anything; each distinct
    # (shape, stride) is checked once, as a model repeats a handful of them, and
    # every record gets the first such pair, so equal shapes are one tuple in memory.
    sound_geometry: dict[tuple[object, object], tuple[tuple[int, ...], tuple[int, ...], int]] = {}
    itemsizes: dict[str, int] = {}
    has_data = storage_base is not None
    parameter, buffer, plain = TensorKind.PARAMETER, TensorKind.BUFFER, TensorKind.TENSOR
    append = tensors.append
    # A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the
    # same record from a tuple of its fields in compiled code, in half the time.
    new_record = tuple.__new__
    # One pass, one record per tensor and per storage: this loop runs once per
    # tensor of the checkpoint, so it builds records positionally.
    for name, tensor, is_buffer, in_optimizer, section in walk_tensors(root):
        geometry = (tensor.shape, tensor.stride)
        try:
            sound = sound_geometry.get(geometry)
        except TypeError:  # an unhashable dimension
            sound = None
        if sound is None:
            problem = _geometry_problem(tensor)
            if problem is not None:
                raise CorruptCheckpointError(f"{source}: tensor {name!r:.120} has an impossible layout: {problem}")
            sound = sound_geometry[geometry] = (tensor.shape, tensor.stride, _last_index(tensor.shape, tensor.stride))
        offset = tensor.offset
        if type(offset) is not int or offset < 0:
            raise CorruptCheckpointError(f"{source}: tensor {name!r:.120} has storage offset {offset!r:.40}")
        storage: PickledStorage | None = tensor.storage
        if storage is not None and sound[2] >= 0:
            itemsize = itemsizes.get(tensor.dtype)
            if itemsize is None:
                itemsize = itemsizes[tensor.dtype] = dtype_info(tensor.dtype).itemsize
            if (offset + sound[2] + 1) * itemsize > storage.nbytes:
                # torch.load's set_() would have to grow the storage, which it refuses
                # ("Trying to resize storage that is not resizable").
                raise CorruptCheckpointError(
                    f"{source}: tensor {name!r:.120} reaches byte {(offset + sound[2] + 1) * itemsize} of storage "
                    f"{storage.key!r:.40}, which holds {storage.nbytes}"
                )
        if storage is None:
            key = _meta_storage_key(tensor)
            # A tensor saved without a storage (torch's _rebuild_meta_tensor_no_storage) gets one as
            # large as its view when torch rebuilds it, so its bytes are counted once, as used.
            extent = (offset + sound[2] + 1) * dtype_info(tensor.dtype).itemsize if sound[2] >= 0 else 0
            storages[key] = StorageRecord(key, "meta", extent, None, False)
        else:
            key = storage.key
            if key not in storages:
                base = None
                if storage_base is not None:
                    base = storage_base.get(key)
                    if base is None:
                        raise CorruptCheckpointError(f"{source}: the pickle names storage {key}, which the file lacks")
                if storage_size is not None and storage.nbytes > storage_size.get(key, storage.nbytes):
                    raise CorruptCheckpointError(
                        f"{source}: storage {key} should hold {storage.nbytes} bytes "
                        f"but its record has {storage_size[key]}"
                    )
                storages[key] = new_record(StorageRecord, (
                    key, storage.location, storage.nbytes, base if used_in_place else None, has_data, "",
                ))
        append(
            new_record(TensorRecord, (
                name, parameter if tensor.is_parameter else buffer if is_buffer else plain, tensor.dtype,
                sound[0], sound[1], key, offset, tensor.requires_grad, id(tensor), in_optimizer, section, None, None,
            ))
        )
    return tensors, storages


def modules_and_ties(
    root: Any, tensors: list[TensorRecord], made_placeholders: bool = True
) -> tuple[list[ModuleRecord], list[DeclaredTie]]:
    """The module tree a pickled object holds, and the ties its pickled models declare.

    Every loader of a torch pickle (zip, legacy, TorchScript, bare pickle) asks
    both, from one walk of the tree.

    Args:
        root: The unpickled tree.
        tensors: Its tensor records (declared ties name them).
        made_placeholders: Whether the unpickler made any placeholder; without one
            the tree holds no module and is not walked.
    """
    modules = pickled_modules(root, made_placeholders)
    return module_records(modules), declared_ties_in_tree(modules, [t.name for t in tensors])


def pickled_modules(root: Any, made_placeholders: bool = True) -> list[tuple[str, InertObject]]:
    """(dotted path, placeholder) of every pickled nn.Module in the tree, walked once.

    A pickled module is always a placeholder, so when the unpickler made none (a
    plain state dict or training checkpoint) the tree is not walked at all.
    """
    return list(walk_modules(root)) if made_placeholders else []


def module_records(modules: list[tuple[str, InertObject]]) -> list[ModuleRecord]:
    """The module tree of pickled nn.Modules, with RNN weight layout intent."""
    return [ModuleRecord(path, type(module).qualified_name(), _rnn_record(path, module)) for path, module in modules]


def _rnn_record(path: str, module: InertObject) -> RnnRecord | None:
    # Recognized by its state (`mode` and `_flat_weights_names`), which RNNBase always
    # sets, not by its class: a subclass defined elsewhere is an RNN too.
    state = module.state_dict
    names = state.get("_flat_weights_names")
    mode = state.get("mode")
    if not isinstance(names, list) or not isinstance(mode, str):
        return None
    parameters = state.get("_parameters") or {}
    prefix = f"{path}." if path else ""
    unregistered = tuple(f"{prefix}{n}" for n in names if not isinstance(parameters.get(n), PickledTensor))
    return RnnRecord(mode, tuple(f"{prefix}{n}" for n in names), unregistered, known_from="pickled")


def declared_ties_in_tree(modules: list[tuple[str, InertObject]], names: list[str]) -> list[DeclaredTie]:
    """Ties a pickled Hugging Face model declares through its own state.

    A pickled `PreTrainedModel` carries its config as a placeholder whose state is
    the config's attributes (`tie_word_embeddings`, `tie_encoder_decoder`), and
    transformers 5 models also carry `all_tied_weights_keys` ({target: source}).
    Both are read from the inert tree; nothing from transformers is imported.

    Args:
        modules: The tree's pickled modules, from `pickled_modules`.
        names: Every tensor name found in the tree.

    Returns:
        Declared ties, named from the root, without duplicates.
    """
    ties: list[DeclaredTie] = []
    seen: set[frozenset[str]] = set()
    for path, module in modules:
        state = module.state_dict
        config = state.get("config")
        if not isinstance(config, InertObject) or not config.state_dict:
            continue
        prefix = f"{path}." if path else ""
        local = [n[len(prefix) :] for n in names if n.startswith(prefix)]
        found = declared_ties(config.state_dict, local, f"pickled {type(config).class_name}")
        mapping = state.get("all_tied_weights_keys")
        if isinstance(mapping, dict):
            found += [
                DeclaredTie(str(target), str(source), f"{type(module).class_name}.all_tied_weights_keys")
                for target, source in mapping.items()
            ]
        for tie in found:
            pair = frozenset((prefix + tie.target, prefix + tie.source))
            if pair not in seen:
                seen.add(pair)
                ties.append(DeclaredTie(prefix + tie.target, prefix + tie.source, tie.declared_by))
    return ties
