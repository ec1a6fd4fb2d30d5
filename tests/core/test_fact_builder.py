"""build_facts on real torch tensors: every fact agrees with what torch reports of the same tensor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memlayout.core.fact_builder import build_facts  # noqa: E402
from memlayout.load.live import load_live  # noqa: E402


def _views_of_one_buffer() -> dict[str, object]:
    """A buffer, a slice at an offset, a transposed view inside it, a reshaped view, and a tensor of its own."""
    buffer = torch.arange(100, dtype=torch.float32)
    return {
        "buffer": buffer,
        "slice": buffer[10:30],
        "transposed": buffer[40:60].view(4, 5).t(),
        "reshaped": buffer[60:84].view(2, 3, 4),
        "alone": torch.zeros(3, 7, dtype=torch.float16),
    }


def test_each_view_keeps_torchs_offset_stride_shape_and_contiguity() -> None:
    tensors = _views_of_one_buffer()
    facts = build_facts(load_live(tensors))
    for name, tensor in tensors.items():
        fact = facts.tensor(name)
        assert fact is not None, name
        assert fact.offset == tensor.storage_offset(), name
        assert fact.stride == tensor.stride(), name
        assert fact.shape == tuple(tensor.shape), name
        assert fact.contiguous == tensor.is_contiguous(), name
        assert fact.itemsize == tensor.element_size(), name
        assert fact.nbytes == tensor.numel() * tensor.element_size(), name
        assert fact.bytes_used.start == tensor.storage_offset() * tensor.element_size(), name
        if fact.data_address is not None:
            assert fact.data_address == tensor.data_ptr(), name


def test_views_share_a_storage_exactly_when_torchs_storage_pointers_are_equal() -> None:
    tensors = _views_of_one_buffer()
    facts = build_facts(load_live(tensors))
    for first, a in tensors.items():
        for second, b in tensors.items():
            same_in_torch = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            assert (facts.tensor(first).storage == facts.tensor(second).storage) == same_in_torch, (first, second)
    shared = facts.storage(facts.tensor("buffer").storage)
    assert shared.nbytes == tensors["buffer"].untyped_storage().nbytes()
    assert set(shared.tensors) == {"buffer", "slice", "transposed", "reshaped"}


def test_overlapping_views_of_one_buffer_form_an_alias_group() -> None:
    tensors = _views_of_one_buffer()
    facts = build_facts(load_live(tensors))
    (group,) = facts.alias_groups
    assert group.storage == facts.tensor("buffer").storage
    # Every view lies inside the whole buffer, and no two of the slices meet.
    assert {frozenset((p.first, p.second)) for p in group.pairs} == {
        frozenset(("buffer", name)) for name in ("slice", "transposed", "reshaped")
    }


def test_a_slice_alone_leaves_the_rest_of_its_storage_unused() -> None:
    whole = torch.arange(100, dtype=torch.float32)
    piece = whole[10:30]
    facts = build_facts(load_live({"piece": piece}))
    storage = facts.storage(facts.tensor("piece").storage)
    assert storage.nbytes == piece.untyped_storage().nbytes()
    assert storage.used_bytes == piece.numel() * piece.element_size()
    assert storage.padding_bytes + storage.unused_bytes == piece.untyped_storage().nbytes() - storage.used_bytes
    assert storage.used == ((piece.storage_offset() * 4, (piece.storage_offset() + piece.numel()) * 4),)


def test_one_tensor_under_two_names_is_one_fact_with_both_names() -> None:
    weight = torch.ones(4, 4)
    facts = build_facts(load_live({"embed.weight": weight, "head.weight": weight, "bias": torch.zeros(4)}))
    embed, head = facts.tensor("embed.weight"), facts.tensor("head.weight")
    assert embed is head
    assert embed.names == ("embed.weight", "head.weight")
    assert len(facts.tensors) == 2
    assert len(facts.storages) == 2
    assert facts.alias_groups == ()


def test_a_tied_module_parameter_is_one_parameter_object() -> None:
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = model.embed.weight
    facts = build_facts(load_live(model))
    fact = facts.tensor("head.weight")
    assert fact is not None and fact is facts.tensor("embed.weight")
    assert model.head.weight is model.embed.weight
    assert len(fact.parameter_ids) == 1
    assert fact.requires_grad == model.embed.weight.requires_grad
