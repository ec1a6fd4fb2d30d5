"""Load a flat checkpoint into a fresh model without losing the flat layout.

`load_state_dict` copies each tensor into the model's own storages, one per
parameter, so the layout `memlayout flatten` wrote is gone after loading. Here the
model's tensors are re-pointed at the checkpoint's buffers instead, each buffer
moved to the device in one copy.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.core.strides import MemoryFormat
from memlayout.errors import FlattenError, UsageError
from memlayout.flatten.apply import torch_dtype
from memlayout.flatten.handle import FlatHandle
from memlayout.flatten.live import flatten_object, resolve_device
from memlayout.flatten.plan import dense_strides
from memlayout.load.safetensors_file import MEMLAYOUT_ALIASES_KEY as ALIASES_KEY
from memlayout.load.safetensors_file import read_header

if TYPE_CHECKING:
    import torch


def _to_device(state: dict[str, Any], device: str) -> dict[str, Any]:
    # Move each storage once and rebuild the views on it, so sharing survives the move.
    import torch

    moved: dict[int, Any] = {}
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            out[name] = tensor
            continue
        storage = tensor.untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else id(tensor)
        if key not in moved:
            whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
            moved[key] = whole.to(device).untyped_storage()
        view = torch.empty(0, dtype=tensor.dtype, device=device)
        view.set_(moved[key], tensor.storage_offset(), tensor.shape, tensor.stride())
        out[name] = view
    return out


def _state_for(model: Any, state: Any) -> dict[str, Any]:
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    if isinstance(state, dict) and not names & state.keys() and isinstance(state.get("model"), dict):
        return dict(state["model"])  # a training checkpoint: take its model section
    if not isinstance(state, dict):
        raise UsageError(f"the checkpoint holds a {type(state).__name__}, not a state dict")
    return dict(state)


def repoint(model: Any, state: dict[str, Any]) -> None:
    """Point every parameter and persistent buffer of `model` at the tensor of the same name.

    Args:
        model: The fresh nn.Module.
        state: Name -> tensor, on the target device.

    Raises:
        FlattenError: a name is missing or a shape or dtype differs; the model is untouched.
    """
    import torch

    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        new = state.get(name)
        if new is None:
            if isinstance(tensor, torch.nn.Parameter):
                raise FlattenError(f"the checkpoint has no {name}", "load a checkpoint saved from this model")
            continue  # a non-persistent buffer, never in a state dict
        if new.shape != tensor.shape or new.dtype != tensor.dtype:
            raise FlattenError(
                f"{name} is {tuple(new.shape)} {new.dtype} in the checkpoint but {tuple(tensor.shape)} {tensor.dtype} "
                "in the model"
            )
        pairs.append((tensor, new))
    with torch.no_grad():
        for tensor, new in pairs:
            tensor.data = new
    for module in model.modules():
        if isinstance(module, torch.nn.RNNBase):
            _torch.refresh_rnn_flat_weights(module)


def load_flat_safetensors(path: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a view of one buffer holding its data section.

    Args:
        path: The file (any safetensors file; aliases are restored when present).
        device: "cpu" maps the file (zero-copy); a CUDA device gets one host-to-device copy.

    Returns:
        Name -> tensor, aliases included.
    """
    import torch

    header, file_size = read_header(path)
    # shared=False maps copy-on-write: nothing is read until touched, and writes stay private.
    whole: Any = torch.UntypedStorage.from_file(path, shared=False, nbytes=file_size)
    data = torch.empty(0, dtype=torch.uint8).set_(whole, header.data_start, (file_size - header.data_start,), (1,))
    if device != "cpu":
        data = data.to(device)
    storage: Any = data.untyped_storage()
    base = data.storage_offset()
    state: dict[str, torch.Tensor] = {}
    for entry in header.entries:
        dtype = torch_dtype(entry.dtype)
        start = base + entry.start - header.data_start
        if start % dtype.itemsize:
            raise FlattenError(f"{entry.name} is not aligned to its element size in {path}",
                               "rewrite it with memlayout flatten")
        view = torch.empty(0, dtype=dtype, device=data.device)
        view.set_(storage, start // dtype.itemsize, entry.shape, dense_strides(entry.shape, MemoryFormat.CONTIGUOUS))
        state[entry.name] = view
    for name, alias in json.loads(header.metadata.get(ALIASES_KEY, "{}")).items():
        owner = state[alias["of"]]
        dtype = torch_dtype(alias["dtype"])
        owner_start = owner.storage_offset() * owner.element_size()
        view = torch.empty(0, dtype=dtype, device=data.device)
        view.set_(storage, owner_start // dtype.itemsize + alias["offset"], tuple(alias["shape"]),
                  tuple(alias["stride"]))
        state[name] = view
    return {name: tensor for name, tensor in state.items() if not name.startswith("__memlayout_slot_")}


def load_flat_checkpoint(model: Any, path: str, device: str | None = None) -> FlatHandle:
    """Restore a flat checkpoint into `model`, keeping its buffers and ties.

    Args:
        model: A freshly built nn.Module.
        path: A torch.save state dict (or training checkpoint with a "model"
            section) or a safetensors file written by `memlayout flatten`.
        device: "cpu", "cuda", "cuda:N" or "auto"; None means CPU.

    Returns:
        The `FlatHandle` over the loaded buffers (unchanged when the file was flat).
    """
    import torch


    target = resolve_device(device) or "cpu"
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(b"PK\x03\x04"):
        state = _state_for(model, torch.load(path, map_location="cpu", weights_only=True))
        if target != "cpu":
            state = _to_device(state, target)
    else:
        state = load_flat_safetensors(path, target)
    repoint(model, state)
    return flatten_object(model)
