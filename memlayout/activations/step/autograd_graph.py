"""The autograd graph as torch's engine walks it: each node by a key that outlives its Python object, the edges
below a root, how many lead into each node (engine.cpp's compute_dependencies), and the leaves they reach.

gpu_free_backward.py runs backward over this walk; run.py asks it which leaves a first backward would give a
gradient.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from memlayout import _torch

ACCUMULATE_GRAD = "AccumulateGrad"


def is_accumulate_grad(node: Any) -> bool:
    # By the node's type, not `node.name()`: torch 2.11 refuses `name()` on a custom autograd.Function's
    # node ("a legacy access pattern that is no longer supported"), seen on an H100's torch 2.11.0+cu130.
    return type(node).__name__ == ACCUMULATE_GRAD


class NodeKey:
    """A node known by its key alone (`node_key`): what `register_multi_grad_hook` keeps instead of the node."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key


def node_key(node: Any) -> tuple[Any, ...]:
    # A node's Python object is made afresh each time `next_functions` is read once the last one died,
    # so a node is known by what does not change: every AccumulateGrad reports the same sequence number,
    # and is known by its parameter instead.
    if isinstance(node, NodeKey):
        return node.key
    if is_accumulate_grad(node):
        return (ACCUMULATE_GRAD, id(node.variable))
    return (type(node).__name__, _torch.autograd_node_sequence_nr(node))


def edges(node: Any) -> tuple[tuple[Any, int], ...]:
    found: tuple[tuple[Any, int], ...] = node.next_functions
    return found


def graph_edges(root: Any) -> Iterator[tuple[Any, Any, bool]]:
    """Every edge below the root, once each, as (child, its key, whether the walk reaches the child first here)."""
    seen = {node_key(root)}
    stack = [root]
    while stack:
        node = stack.pop()
        for child, _ in edges(node):
            if child is None:
                continue
            key = node_key(child)
            first = key not in seen
            if first:
                seen.add(key)
                stack.append(child)
            yield child, key, first


def dependencies(root: Any) -> dict[Any, int]:
    """For each node below the root, how many edges lead into it (engine.cpp's compute_dependencies)."""
    counts: dict[Any, int] = {}
    for _, key, _ in graph_edges(root):
        counts[key] = counts.get(key, 0) + 1
    return counts


def leaves_reached(root: Any) -> list[Any]:
    """The leaf tensors (parameters, inputs that require grad) whose gradient backward from `root` accumulates.

    The graph's AccumulateGrad nodes, walked as `dependencies` walks it (`graph_edges`): the set of tensors a
    backward would give a gradient, found without running one. A custom Function whose backward
    returns None for an input is still counted: the walk sees the edge, not the value.
    """
    nodes = [root, *(child for child, _, first in graph_edges(root) if first)]
    return [node.variable for node in nodes if is_accumulate_grad(node)]
