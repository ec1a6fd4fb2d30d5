"""What the tracer does with tensor parallelism's DTensors, so that a rank's trace holds its local memory alone.

A DTensor runs each op as ops on its local tensors, which come back through the
tracer as plain ones: those are the rank's memory. Around them DTensor decides
each output's shape by running the op once more on fake tensors of the global
shapes (its sharding propagation), and tries placements on meta tensors: neither
is memory of the step, so neither is recorded. A DTensor's own storage is its
global shape's; what a rank holds is its local shard.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Protocol

from memlayout import _torch

if TYPE_CHECKING:
    import torch

TRACE = object()
"""`outside_the_step`'s answer for an op the tracer records."""


class _Counting(Protocol):
    propagating: int


class Propagating:
    """Counts the tracer into DTensor's sharding propagation and out (`_torch.around_dtensor_shape_propagation`)."""

    def __init__(self, tracer: _Counting) -> None:
        self.tracer = tracer

    def __enter__(self) -> None:
        self.tracer.propagating += 1

    def __exit__(self, *exc: object) -> None:
        self.tracer.propagating -= 1


def is_sharded(model: Any) -> bool:
    """Whether the model has tensor-parallel (DTensor) parameters."""
    return any(_has_dtensor((type(parameter),)) for parameter in model.parameters())


def outside_the_step(func: Any, types: Any, args: Any, kwargs: dict[str, Any], propagating: int) -> Any:
    """The result of an op that is no memory of the rank's step, run as DTensor needs it; TRACE for one that is."""
    if _has_dtensor(types):
        return NotImplemented  # DTensor runs the op as ops on its local tensors, which come back to the tracer
    if propagating:
        # DTensor deciding an output's shape on fake tensors of the global shapes: no memory of the step, and no
        # value for the fake step to make real
        return _torch.on_fake_mode_alone(func, args, kwargs)
    if _on_meta_only(args, kwargs):
        return func(*args, **kwargs)  # DTensor trying a placement on meta tensors: the same
    return TRACE


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's memory on this rank: a DTensor's local shard, any other tensor itself."""
    return tensor.to_local() if _has_dtensor((type(tensor),)) else tensor  # type: ignore[attr-defined]


def _has_dtensor(types: Any) -> bool:
    """Whether a DTensor is among an op's argument types: never before its module is loaded."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and any(issubclass(t, dtensor) for t in types)


def _on_meta_only(args: Any, kwargs: Any) -> bool:
    """An op on the meta device alone: DTensor's sharding propagation tries a decomposition on meta tensors."""
    import torch

    devices = [value.device for value in _torch.tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)]
    if not devices:
        device = (kwargs or {}).get("device")
        return device is not None and torch.device(device).type == "meta"
    return all(device.type == "meta" for device in devices)
