"""A module's plain Python state (counters, flags, the lengths of caches), snapshotted and compared.

What a checkpointed module's rerun reads from `self` besides tensors: the tracer
(tracer.py) snapshots it around forward and around each rerun, to tell a replay
from another computation.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_MODULE_INTERNALS = frozenset(("training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                               "forward"))
_SIMPLE = (int, float, bool, str, bytes, type(None))


def python_state(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Each module's plain Python attributes: numbers, strings and the lengths of containers.

    What a checkpointed module's rerun reads from `self` besides tensors: a counter, a
    cache's length, a flag. Hooks and torch's own bookkeeping are left out.
    """
    return {path: module_attributes(module) for path, module in model.named_modules()}


class _SameTensor:
    """A tensor attribute, compared by identity (a weak reference: it must not keep the tensor alive)."""

    __slots__ = ("ref", "shown")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.ref = weakref.ref(tensor)
        self.shown = f"a {str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} tensor"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameTensor) and self.ref() is not None and self.ref() is other.ref()

    def __hash__(self) -> int:
        return id(self.ref())

    def __repr__(self) -> str:
        return self.shown


def module_attributes(module: torch.nn.Module, tensors: bool = False) -> dict[str, Any]:
    """A module's own plain attributes (not its parameters, buffers or children): numbers, strings, the
    lengths of containers, and with `tensors` the identity of tensors kept on it."""
    import torch

    values: dict[str, Any] = {}
    for name, value in vars(module).items():
        if name in _MODULE_INTERNALS or name.endswith("_hooks") or name.endswith("_hooks_with_kwargs"):
            continue
        if isinstance(value, _SIMPLE):
            values[name] = value
        elif isinstance(value, (list, dict, set, tuple)):
            values[name] = ("len", len(value))
        elif tensors and isinstance(value, torch.Tensor):
            values[name] = _SameTensor(value)
    return values


def state_changes(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """module path -> which attribute the forward changed, for each module whose plain state changed."""
    changes: dict[str, str] = {}
    for path, values in after.items():
        old = before.get(path, {})
        for name in sorted(set(values) | set(old)):
            if values.get(name) != old.get(name):
                changes[path] = f"self.{name} ({shown_value(old.get(name))} -> {shown_value(values.get(name))})"
                break
    return changes


def shown_value(value: Any) -> str:
    """An attribute's snapshotted value as a note shows it: a container's length, or its repr cut to 40 characters."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "len":
        return f"{value[1]} items"
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
