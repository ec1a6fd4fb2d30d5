"""Walking an inert unpickled tree: every tensor with its dotted name, and every pickled nn.Module."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from memlayout.load.pickled_objects import InertObject, PickledTensor
from memlayout.load.records import section_of

WalkedTensor = tuple[str, PickledTensor, bool, bool, str]
"""A tensor found in the object tree: (dotted name, tensor, is_buffer, in_optimizer, section).

A plain tuple, not a record class: the walk yields one per tensor of the file."""


def is_module_state(state: dict[str, Any]) -> bool:
    """An nn.Module's pickled instance dict has these keys."""
    return "_parameters" in state and "_modules" in state


def walk_tensors(obj: Any, prefix: str = "") -> list[WalkedTensor]:
    """Every tensor in an unpickled tree with its dotted name, in pickle order.

    Dicts contribute their keys, lists and tuples their indices, pickled modules
    their parameters, buffers and children. A dict with `state` and
    `param_groups` is an optimizer's state dict.
    """
    found: list[WalkedTensor] = []
    if type(obj) is PickledTensor:
        found.append((prefix, obj, False, False, ""))
    else:
        _walk(obj, prefix, False, set(), "", found)
    return found


def walk_modules(obj: Any, prefix: str = "") -> Iterator[tuple[str, InertObject]]:
    """Yield (dotted path, placeholder) for every pickled nn.Module in a tree."""
    yield from _walk_modules(obj, prefix, set())


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _children(obj: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(obj, dict):
        yield from obj.items()
    elif isinstance(obj, (list, tuple)):
        yield from enumerate(obj)
    elif isinstance(obj, InertObject):
        yield from obj.state_dict.items()
        yield from enumerate(obj.items)


def _walk(
    obj: Any, prefix: str, in_optimizer: bool, seen: set[int], section: str, found: list[WalkedTensor]
) -> None:
    # Appends to one list rather than yielding through every level: a state dict's
    # tensors are each one step below the root, and a generator per step cost more
    # than the rest of the walk.
    if id(obj) in seen or not isinstance(obj, (dict, list, tuple, InertObject)):
        return
    seen.add(id(obj))
    if isinstance(obj, InertObject) and is_module_state(obj.state_dict):
        state = obj.state_dict
        # Parameters, then buffers, then children: the order named_parameters walks.
        for holder, is_buffer in (("_parameters", False), ("_buffers", True)):
            for key, value in (state.get(holder) or {}).items():
                if type(value) is PickledTensor:
                    found.append((_join(prefix, key), value, is_buffer, in_optimizer, section))
        for key, value in (state.get("_modules") or {}).items():
            _walk(value, _join(prefix, key), in_optimizer, seen, section, found)
        return
    if isinstance(obj, dict) and {"state", "param_groups"} <= obj.keys():
        in_optimizer = True
    dotted = f"{prefix}." if prefix else ""
    for key, value in obj.items() if type(obj) is dict or type(obj) is collections.OrderedDict else _children(obj):
        if type(value) is PickledTensor:
            # A tensor keeps its parent's section (section_of with value_is_tensor).
            # A top-level name is the key itself: a state dict's 100,000 names are
            # not copied.
            name = key if not dotted and type(key) is str else f"{dotted}{key}"
            found.append((name, value, False, in_optimizer, section))
        else:
            _walk(value, f"{dotted}{key}", in_optimizer, seen, section_of(prefix, key, False, section), found)


def _walk_modules(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, InertObject]]:
    if id(obj) in seen or not isinstance(obj, (dict, list, tuple, InertObject)):
        return
    seen.add(id(obj))
    if isinstance(obj, InertObject) and is_module_state(obj.state_dict):
        yield prefix, obj
        for key, value in (obj.state_dict.get("_modules") or {}).items():
            yield from _walk_modules(value, _join(prefix, key), seen)
        return
    for key, value in _children(obj):
        yield from _walk_modules(value, _join(prefix, key), seen)
