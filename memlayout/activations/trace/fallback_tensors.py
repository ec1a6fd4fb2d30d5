"""The tensors of a fallback to a real kernel (trace/fake_step.py): real, zero-filled stand-ins of the arguments'
shapes, dtypes and strides, a key for the call, and fake tensors of the outputs' metadata and storage size."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout import _torch

if TYPE_CHECKING:
    import torch


class TensorMetadata:
    """A tensor's metadata and storage size, without the tensor: what a fallback's real output leaves."""

    __slots__ = ("device", "dtype", "offset", "shape", "storage_bytes", "stride")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape = tuple(tensor.shape)
        self.stride = tuple(tensor.stride())
        self.offset = tensor.storage_offset()
        self.dtype = tensor.dtype
        self.device = tensor.device
        self.storage_bytes = tensor.untyped_storage().nbytes()


def tensor_metadata(value: Any) -> Any:
    import torch

    return TensorMetadata(value) if isinstance(value, torch.Tensor) else value


def fake_from(meta: TensorMetadata) -> torch.Tensor:
    """A fake tensor of this metadata and storage size (not with `set_`: the fake mode's dispatch cache would
    keep the storage it is given alive)."""
    import torch

    made = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=meta.device)
    if meta.offset == 0 and made.untyped_storage().nbytes() == meta.storage_bytes:
        return made
    itemsize = made.element_size()
    base = torch.empty((-(-meta.storage_bytes // itemsize),), dtype=meta.dtype, device=meta.device)
    return base.as_strided(meta.shape, meta.stride, meta.offset)


def zeros_like_metadata(value: Any) -> Any:
    """A real, zero-filled tensor with a tensor's shape, dtype and strides (other values pass through)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    with _torch.unset_fake_temporarily():
        storage_elements = value.untyped_storage().nbytes() // max(value.element_size(), 1)
        base = torch.zeros((storage_elements,), dtype=value.dtype, device=value.device)
        return base.as_strided(value.shape, value.stride(), value.storage_offset())


def zeros_of_fakes(value: Any) -> Any:
    return zeros_like_metadata(value) if isinstance(value, _torch.FakeTensor) else value


def call_key(func: Any, args: Any, kwargs: Any) -> Any:
    """The op and its arguments' metadata and values: calls with the same key make outputs of the same metadata."""
    import torch

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype,
                    str(value.device))
        return value if isinstance(value, (int, float, bool, str, type(None), torch.dtype)) else repr(value)

    leaves, spec = _torch.tree_flatten((args, kwargs))
    return (func, str(spec), tuple(describe(v) for v in leaves))
