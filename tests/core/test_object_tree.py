"""The one walk over live containers: what it looks into, in what order, and how often."""

from __future__ import annotations

import types
from collections import OrderedDict

import torch

from memlayout.activations.step.run import output_tensors
from memlayout.core.object_tree import tree_leaves
from memlayout.flatten.apply import modules_of, walk_tensors


def test_leaves_come_depth_first_in_container_order() -> None:
    tree = {"a": [1, (2, 3)], "b": OrderedDict(c=4), "d": 5}
    assert list(tree_leaves(tree)) == [1, 2, 3, 4, 5]


def test_a_leaf_held_twice_is_yielded_twice_and_a_container_held_twice_is_walked_once() -> None:
    shared = [1, 2]
    leaf = object()
    assert list(tree_leaves({"x": shared, "y": shared, "z": (leaf, leaf)})) == [1, 2, leaf, leaf]


def test_a_container_that_holds_itself_is_walked_once() -> None:
    loop: list[object] = [1]
    loop.append(loop)
    assert list(tree_leaves(loop)) == [1]


def test_only_dicts_are_looked_into_unless_any_mapping_is_asked_for() -> None:
    proxy = types.MappingProxyType({"w": 1})
    assert list(tree_leaves([proxy])) == [proxy]
    assert list(tree_leaves([proxy], any_mapping=True)) == [1]


def test_a_module_is_a_leaf() -> None:
    linear = torch.nn.Linear(2, 2)
    assert list(tree_leaves({"model": linear})) == [linear]


def test_flatten_walks_each_module_once_and_every_strided_tensor_it_is_given() -> None:
    linear = torch.nn.Linear(2, 2)
    extra = torch.zeros(3)
    sparse = torch.zeros(2, 2).to_sparse()
    found = list(walk_tensors({"a": linear, "b": [linear, extra, extra, sparse]}))
    assert [id(t) for t in found] == [id(linear.weight), id(linear.bias), id(extra), id(extra)]
    assert list(modules_of([linear, {"again": linear}])) == [linear, linear]


def test_a_models_output_gives_every_tensor_it_holds_in_any_mapping() -> None:
    logits = torch.ones(2)
    output = types.MappingProxyType({"logits": logits, "hidden": (logits, [torch.zeros(1)]), "cache": object()})
    assert [t.shape for t in output_tensors(output)] == [(2,), (2,), (1,)]
