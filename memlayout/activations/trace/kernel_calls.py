"""One op call's arguments as metadata, for learning what its real kernel allocates (kernel_storage.py).

The metadata of each tensor argument (shape, strides, offset, dtype, device) stands
in for the tensor: it is shrunk to a smaller batch with its layout kept, described
for a cache key, and rebuilt as real zero-filled tensors for the kernel to run on
(zeros cost no memory until written).
"""

from __future__ import annotations

from typing import Any

from memlayout import _torch
from memlayout.core.strides import dense_strides_in_order, dimension_order, expanded_dimensions


class Metadata:
    __slots__ = ("device", "dtype", "offset", "shape", "stride")

    def __init__(self, tensor: Any) -> None:
        self.shape = tuple(int(s) for s in tensor.shape)
        self.stride = tuple(int(s) for s in tensor.stride())
        self.offset = int(tensor.storage_offset())
        self.dtype = tensor.dtype
        self.device = tensor.device


def metadata_only(value: Any) -> Any:
    import torch

    return Metadata(value) if isinstance(value, torch.Tensor) and value.layout == torch.strided else value


def shrunk(metadata: Any, batched: tuple[bool, ...], size: int) -> tuple[int, tuple[Any, Any]]:
    """The arguments' metadata with the batch dimension set to `size`, and the batched tensors' elements."""
    leaves, spec = _torch.tree_flatten(metadata)
    tensors = iter(batched)
    numel = 0
    out: list[Any] = []
    for leaf in leaves:
        if not isinstance(leaf, Metadata):
            out.append(leaf)
            continue
        made = Metadata.__new__(Metadata)
        made.dtype, made.device, made.offset = leaf.dtype, leaf.device, 0
        made.shape = (size, *leaf.shape[1:]) if next(tensors) else leaf.shape
        made.stride = _contiguous_like(made.shape, leaf.stride)
        if made.shape is not leaf.shape:
            elements = 1
            for dim in made.shape:
                elements *= dim
            numel += elements
        out.append(made)
    args, kwargs = _torch.tree_unflatten(out, spec)
    return numel, (args, kwargs)


def shape_only(value: Any) -> Any:
    """A tensor's metadata as its shape, which torch's flop formulas read (they take shapes for tensors)."""
    return tuple(value.shape) if isinstance(value, Metadata) else value


def _contiguous_like(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides for `shape` in the dimension order of `stride` (channels-last stays channels-last), an expanded
    dimension left expanded. Grouped-query attention's keys with one head per rank are such a view (transformers'
    `repeat_kv` expands the head); made dense and innermost, SDPA copied them, and the rule learned from those runs
    read a tensor-parallel rank's attention scratch at 90,372 B where the kernel takes 22,784 B."""
    expanded = expanded_dimensions(shape, stride)
    kept = tuple(1 if dim in expanded else size for dim, size in enumerate(shape))
    order = tuple(sorted(range(len(shape)), key=lambda dim: (-stride[dim], dim)))
    dense = dense_strides_in_order(kept, order)
    return tuple(0 if dim in expanded else step for dim, step in enumerate(dense))


def meta_like_metadata(value: Any) -> Any:
    """A tensor's metadata as a meta tensor of its shape, strides and dtype (for counting an op's FLOPs); others as
    they are."""
    import torch

    if isinstance(value, Metadata):
        return torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device="meta")
    return value


def zeros_like_metadata(value: Any) -> Any:
    import torch

    if isinstance(value, Metadata):
        span = 1 + sum((s - 1) * st for s, st in zip(value.shape, value.stride, strict=True)) if all(value.shape) else 0
        base = torch.zeros((value.offset + span,), dtype=value.dtype, device=value.device)
        return base.as_strided(value.shape, value.stride, value.offset)
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return zeros_like_metadata(Metadata(value))
    return value


def strided_tensors(values: Any) -> Any:
    import torch

    leaves, _ = _torch.tree_flatten(values)
    return (leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided)


def described(tensor: Any, shrinks: bool) -> Any:
    """A tensor argument as a learned rule's cache key knows it: its shape (less the batch where it shrinks), dtype,
    layout, device, the order of its dimensions in memory (two transposes of one shape are laid out apart) and
    which it expands."""
    shape = tuple(int(s) for s in tensor.shape)
    stride = tuple(int(s) for s in tensor.stride())
    return (shrinks, shape[1:] if shrinks else shape, tensor.dtype, tensor.layout, str(tensor.device),
            tensor.is_contiguous(), tensor.is_contiguous(memory_format=_channels_last(tensor)),
            dimension_order(shape, stride), expanded_dimensions(shape, stride))


def _channels_last(tensor: Any) -> Any:
    import torch

    return torch.channels_last if tensor.dim() == 4 else torch.contiguous_format


def scalars(args: Any, kwargs: Any) -> Any:
    import torch

    leaves, spec = _torch.tree_flatten((args, kwargs))
    return str(spec), tuple(None if isinstance(v, torch.Tensor) else repr(v) for v in leaves)
