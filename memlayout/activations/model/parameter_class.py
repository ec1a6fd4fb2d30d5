"""A Parameter subclass and the state it keeps in its attributes, carried into the fake or meta world.

bitsandbytes' quantized weights are Parameter subclasses whose data is the packed
weight and whose attributes hold the rest: `Params4bit` keeps its `quant_state`
(the absmax of each block, the 16-value code, and with double quantization a
second, nested state), its `blocksize`, `quant_type` and `compress_statistics`,
and a back-reference to its module; `Int8Params` keeps `CB` and `SCB`. Code that
runs on them reads those attributes (peft's LoRA layer for a 4-bit base reads
`weight.compress_statistics`) or checks the class by name (peft's DoRA
dequantizes a weight only if `weight.__class__.__name__ == "Params4bit"`).

A plain `torch.nn.Parameter(fake_data)` keeps neither, and the subclass itself
cannot hold a fake tensor: `torch.Tensor._make_subclass` refuses data that already
has a Python type (FakeTensor). So a moved parameter is a FakeTensor whose class is
made a subclass of both FakeTensor and the original class, under the original's
name: fake dispatch runs as for any fake tensor, and isinstance and name checks
see what they see on real tensors. On the meta device (plain tensors) the original
class wraps the data itself. Either way the attributes follow, with every tensor
inside them (the quantization state) moved to the same world.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

from memlayout import _torch

_FAKE_CLASSES: dict[type, type] = {}
"""The original class -> its FakeTensor stand-in, made once per class."""

STANDS_FOR = "_memlayout_stands_for"
"""The attribute of a stand-in class that names the class it stands for."""


def original_class(parameter: Any) -> type:
    """The class a parameter is, or stands for when it is a fake stand-in."""
    cls = type(parameter)
    stands_for: type = getattr(cls, STANDS_FOR, cls)
    return stands_for


def keeps_attributes(parameter: Any) -> bool:
    """Whether a parameter is a Parameter subclass with attributes of its own (torch's Parameter has none)."""
    import torch

    return original_class(parameter) is not torch.nn.Parameter and bool(_own_attributes(parameter))


def moved_parameter(source: Any, moved: Any, move_tensor: Callable[[Any], Any]) -> Any:
    """`moved` (a plain Parameter in the new world) as the class `source` is, with its attributes moved too.

    Args:
        source: the parameter being moved (a Parameter subclass, real, meta or fake).
        moved: `torch.nn.Parameter` of the moved data.
        move_tensor: moves a tensor found in the attributes to the new world.
    """
    import torch

    cls = original_class(source)
    if cls is torch.nn.Parameter or not issubclass(cls, torch.nn.Parameter):
        return moved
    if isinstance(moved, _torch.FakeTensor):
        moved.__class__ = _fake_class(cls)
    else:
        moved = _torch.parameter_of_class(cls, moved.detach(), source.requires_grad)
    memo: dict[int, Any] = {}
    for name, value in _own_attributes(source).items():
        moved.__dict__[name] = _moved_value(value, move_tensor, memo)
    return moved


def attribute_tensors(parameter: Any) -> Iterator[Any]:
    """Every tensor a parameter keeps in its attributes (its quantization state), each once; its data not included."""
    seen: set[int] = set()
    for value in _own_attributes(parameter).values():
        yield from _tensors_in(value, seen, depth=0)


def _own_attributes(parameter: Any) -> dict[str, Any]:
    # A FakeTensor keeps its own bookkeeping in its __dict__ (fake_mode, constant, ...): only what the
    # parameter's class puts there is the parameter's.

    attributes = dict(getattr(parameter, "__dict__", {}))
    if isinstance(parameter, _torch.FakeTensor):
        for name in _fake_tensor_fields():
            attributes.pop(name, None)
    attributes.pop("_is_param", None)
    return attributes


@functools.cache
def _fake_tensor_fields() -> frozenset[str]:
    """The names a FakeTensor itself keeps in its __dict__, read off one."""
    import torch


    with _torch.FakeTensorMode():
        probe = torch.empty(0)
    return frozenset(vars(probe))


def _fake_class(cls: type) -> type:

    known = _FAKE_CLASSES.get(cls)
    if known is None:
        # The original's name, as peft compares `__class__.__name__`; FakeTensor first in the MRO, so that its
        # dispatch (and its disabled __torch_function__) is what runs.
        known = type(cls.__name__, (_torch.FakeTensor, cls), {STANDS_FOR: cls, "__module__": cls.__module__,
                                                            "__qualname__": cls.__qualname__})
        _FAKE_CLASSES[cls] = known
    return known


def _moved_value(value: Any, move_tensor: Callable[[Any], Any], memo: dict[int, Any]) -> Any:
    """A tensor moved; a plain object holding tensors (bitsandbytes' QuantState) copied with its tensors moved,
    once per object; a module (the weight's back-reference) and anything else kept as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return move_tensor(value)
    if isinstance(value, torch.nn.Module) or not hasattr(value, "__dict__") or isinstance(value, type):
        return value
    if not any(True for _ in _tensors_in(value, set(), depth=0)):
        return value
    if id(value) in memo:
        return memo[id(value)]
    copied = copy.copy(value)
    memo[id(value)] = copied
    for name, inner in vars(value).items():
        setattr(copied, name, _moved_value(inner, move_tensor, memo))
    return copied


def _tensors_in(value: Any, seen: set[int], depth: int) -> Iterator[Any]:
    import torch

    if depth > 4 or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item, seen, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)):
        for inner in vars(value).values():
            yield from _tensors_in(inner, seen, depth + 1)
