"""The one walk over a live object's containers: nested mappings, lists and tuples.

Flatten re-points every tensor of a module, state dict or training checkpoint;
activations finds every tensor of a model's output. Both walk the same kind of
tree, with this function: containers are looked into, everything else (a
tensor, an nn.Module, a number) is a leaf, handed to the caller to judge.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


def tree_leaves(obj: Any, any_mapping: bool = False) -> Iterator[Any]:
    """Every leaf held by `obj`'s nested containers, depth first, in their order.

    Args:
        obj: The root: a container, or a leaf itself.
        any_mapping: Look into the values of any `Mapping`, not only of dicts. Flatten
            walks dicts, as the loader that planned it records them; a model's
            output may be any mapping.

    Yields:
        Each leaf, as often as the containers hold it. A container is looked into
        once, so a list held twice (or holding itself) is walked once.
    """
    seen: set[int] = set()

    def walk(node: Any) -> Iterator[Any]:
        if isinstance(node, dict) or (any_mapping and isinstance(node, Mapping)):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            yield node
            return
        if id(node) in seen:
            return
        seen.add(id(node))
        for child in children:
            yield from walk(child)

    yield from walk(obj)
