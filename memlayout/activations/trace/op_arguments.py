"""What an aten op's schema and arguments say, as a dispatch mode asks it on every op: whether it aliases or writes
into an input, which tensors it writes, whether `aten.to` leaves the CPU, its tensor arguments, their bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout import _torch

if TYPE_CHECKING:
    import torch


def aliases(func: Any) -> bool:
    """The op returns a view of an input or writes into one: no new memory, and it must stay with its input."""
    return any(r.alias_info is not None for r in _torch.op_schema(func).returns) or any(
        a.alias_info is not None and a.alias_info.is_write for a in _torch.op_schema(func).arguments
    )


def writes(func: Any) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in _torch.op_schema(func).arguments)


def written(func: Any, args: Any, kwargs: Any) -> list[Any]:
    """The tensor arguments an in-place or out= op writes into."""
    import torch

    names = [a.name for a in _torch.op_schema(func).arguments]
    given = dict(zip(names, args, strict=False)) | dict(kwargs)
    written = [given.get(a.name) for a in _torch.op_schema(func).arguments
               if a.alias_info is not None and a.alias_info.is_write]
    leaves, _ = _torch.tree_flatten(written)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def to_a_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an `aten.to` call moves its tensor to a device other than the CPU (`to.device`, `to.dtype_layout`,
    `to.other`)."""
    import torch

    for value in (*args[1:], *kwargs.values()):
        device = value.device if isinstance(value, torch.Tensor) else value
        if isinstance(device, torch.device) and device.type not in ("cpu", "meta"):
            return True
    return False


def op_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among an op's arguments, in pytree's order, without pytree's cost on every op.

    An aten schema nests tensors one level at most (Tensor, Tensor?, Tensor[], Tensor?[]);
    anything deeper, or a dict, goes through pytree.
    """
    import torch

    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    found.append(item)
                elif isinstance(item, (list, tuple, dict)):
                    return pytree_tensors((args, kwargs))
        elif isinstance(value, dict):
            return pytree_tensors((args, kwargs))
    return found


def pytree_tensors(tree: Any) -> list[torch.Tensor]:
    import torch

    leaves, _ = _torch.tree_flatten(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def nbytes(value: Any) -> int:
    import torch

    leaves, _ = _torch.tree_flatten(value)
    return sum(t.untyped_storage().nbytes() for t in leaves
               if isinstance(t, torch.Tensor) and t.layout == torch.strided)
