"""Invariant checks shared by the flatten tests: each one is a promise of issue 4."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from memlayout.core.cudnn_layout import rnn_layout_problem
from memlayout.core.facts import Facts
from memlayout.core.flat_groups import flat_group_key
from memlayout.core.strides import MemoryFormat, Relation, relation
from memlayout.flatten.live import live_facts

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy of the tensor's bits, so NaN payloads compare exactly."""
    tensor = tensor.detach()
    size = tensor.element_size()
    return (tensor.view(_BITS[size]) if size in _BITS else tensor).cpu().clone()


def named_tensors(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor under the names memlayout's live loader gives it."""
    out: dict[str, torch.Tensor] = {}
    dot = f"{prefix}." if prefix else ""
    if isinstance(obj, torch.nn.Module):
        for name, param in obj.named_parameters(remove_duplicate=False):
            out[dot + name] = param
        for name, buffer in obj.named_buffers(remove_duplicate=False):
            out[dot + name] = buffer
    elif isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            out.update(named_tensors(value, f"{dot}{key}"))
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            out.update(named_tensors(value, f"{dot}{index}"))
    return out


def snapshot(obj: Any) -> dict[str, torch.Tensor]:
    """Values by name, copied, to compare after flattening."""
    return {name: bits(t) for name, t in named_tensors(obj).items()}


def sharing(facts: Facts) -> set[tuple[frozenset[str], Relation]]:
    """Every pair of names whose bytes meet, with how they meet."""
    pairs: set[tuple[frozenset[str], Relation]] = set()
    for tensor in facts.tensors:
        if tensor.numel == 0:
            continue
        for a, b in itertools.combinations(tensor.names, 2):
            pairs.add((frozenset((a, b)), Relation.EQUAL))
    for group in facts.alias_groups:
        for pair in group.pairs:
            first, second = facts.tensor(pair.first), facts.tensor(pair.second)
            assert first is not None and second is not None
            for a in first.names:
                for b in second.names:
                    pairs.add((frozenset((a, b)), relation(first.bytes_used, second.bytes_used)))
    return pairs


def alone(facts: Facts) -> set[str]:
    """Names of views that share bytes with no other view."""
    tied = {name for group in facts.alias_groups for name in group.tensors}
    return {t.name for t in facts.tensors if t.name not in tied}


def assert_flat_invariants(
    before_facts: Facts, before_values: dict[str, torch.Tensor], obj: Any, align: int = 64
) -> Facts:
    """Check every layout promise on a flattened live object; returns its facts."""
    after = live_facts(obj)
    now = named_tensors(obj)
    # Values: bitwise equal under every name.
    assert set(now) == set(before_values)
    for name, value in before_values.items():
        assert now[name].shape == value.shape, name
        assert torch.equal(bits(now[name]), value), name
    # Ties: exactly the same pairs share bytes, in the same way; nothing new shares.
    assert sharing(after) == sharing(before_facts)
    # Contiguity and alignment for views alone in their region.
    shadowed = {n for m in after.modules if m.rnn for n in m.rnn.unregistered}
    lonely_before = alone(before_facts)
    rnn_weights = {n for m in after.modules if m.rnn and not m.rnn.unregistered for n in m.rnn.flat_weight_names}
    for tensor in after.tensors:
        if tensor.numel == 0 or shadowed.intersection(tensor.names) or tensor.self_overlapping:
            continue
        old = before_facts.tensor(tensor.name)
        assert old is not None
        if old.name in lonely_before and not old.self_overlapping:
            assert tensor.memory_format is not MemoryFormat.STRIDED, tensor.name
            if old.memory_format is MemoryFormat.CHANNELS_LAST:
                assert tensor.memory_format is MemoryFormat.CHANNELS_LAST, tensor.name
            if not rnn_weights.intersection(tensor.names):
                assert tensor.data_address is not None and tensor.data_address % align == 0, tensor.name
    # Grouping: lone tensors of one group share one storage.
    storages_of: dict[tuple[str, ...], set[str]] = {}
    for tensor in after.tensors:
        movable = not rnn_weights.intersection(tensor.names) and not shadowed.intersection(tensor.names)
        if tensor.name in lonely_before and tensor.numel > 0 and movable:
            storages_of.setdefault(flat_group_key(tensor), set()).add(tensor.storage)
    assert all(len(s) == 1 for s in storages_of.values()), storages_of
    # RNNs: cuDNN-ready unless a weight-dropout wrapper makes it impossible.
    for module in after.modules:
        if module.rnn and not module.rnn.unregistered:
            assert rnn_layout_problem(after, module.rnn) is None, module.path
    return after


def assert_padding_zero(handle: Any) -> None:
    """Bytes of every flat buffer outside its slots are zero."""
    for flat, group in zip(handle.plan.buffers, handle.groups, strict=True):
        raw = torch.empty(0, dtype=torch.uint8).set_(group.data.untyped_storage(), 0, (flat.nbytes,), (1,))
        used = torch.zeros(flat.nbytes, dtype=torch.bool)
        for slot in flat.slots:
            used[slot.start : slot.start + slot.nbytes] = True
        assert not raw[~used].any(), flat.label

