"""Flattening live modules and state dicts in place: every invariant of issue 4."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings

import memlayout
from memlayout.flatten.handle import FlatHandle
from memlayout.flatten.live import flatten_object, live_facts
from memlayout.flatten.plan import describe_changes, plan_flatten
from tests.flatten.conftest import assert_flat_invariants, assert_padding_zero, snapshot
from tests.flatten.models import ConvNet, LstmLM, TransposedTie, WeightDropLSTM
from tests.flatten.strategies import build_checkpoint, build_module, layout_steps
from tests.models import cudnn_buffer_order

FIXED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FIXED
@given(layout_steps())
def test_generated_modules_keep_every_invariant(steps: list[tuple[str, int]]) -> None:
    module = build_module(steps)
    before, values = live_facts(module), snapshot(module)
    handle = flatten_object(module)
    assert_flat_invariants(before, values, module)
    assert_padding_zero(handle)
    again = flatten_object(module)
    assert not again.changed
    assert describe_changes(plan_flatten(live_facts(module)), live_facts(module)) == []


@FIXED
@given(layout_steps())
def test_generated_checkpoints_keep_every_invariant(steps: list[tuple[str, int]]) -> None:
    checkpoint = build_checkpoint(steps)
    before, values = live_facts(checkpoint), snapshot(checkpoint)
    flatten_object(checkpoint)
    after = assert_flat_invariants(before, values, checkpoint)
    # Each top-level section has its own buffers.
    for storage in after.storages:
        sections = {after.tensor(name).section for name in storage.tensors}  # type: ignore[union-attr]
        assert len(sections) == 1
    assert not flatten_object(checkpoint).changed


def test_identity_tie_stays_one_parameter_object() -> None:
    model = LstmLM()
    flatten_object(model)
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})


def test_transposed_tie_stays_a_view_of_one_slot() -> None:
    model = TransposedTie()
    x = torch.randn(3, 6)
    expected = model(x)
    flatten_object(model)
    assert model.decoder.weight.data_ptr() == model.encoder.weight.data_ptr()
    assert model.decoder.weight.stride() == (1, 6)
    assert torch.equal(model(x), expected)
    with torch.no_grad():
        model.encoder.weight[0, 1] = 42.0
    assert model.decoder.weight[1, 0] == 42.0


def test_lstm_gets_its_own_buffer_in_cudnn_order_from_offset_zero() -> None:
    model = LstmLM()
    tokens = torch.randint(0, 50, (2, 5))
    expected = model(tokens)
    handle = flatten_object(model)
    (group,) = [g for g in handle.groups if g.rnn_module == "lstm"]
    order = cudnn_buffer_order(model.lstm)
    assert group.names == tuple(f"lstm.{name}" for name in order)
    offset = 0
    for name in order:
        assert isinstance(name, str)
        weight = getattr(model.lstm, name)
        assert weight.untyped_storage().data_ptr() == group.data.data_ptr()
        assert weight.storage_offset() == offset
        offset += weight.numel()
    assert group.data.numel() == offset
    assert torch.equal(model(tokens), expected)
    codes = {f.code for f in memlayout.inspect(model).findings}
    assert not codes & {"ML201", "ML203", "ML204", "ML301", "ML401"}


def test_rnn_sees_the_new_weights_after_flatten() -> None:
    model = LstmLM()
    flatten_object(model)
    tokens = torch.randint(0, 50, (1, 4))
    before = model(tokens)
    with torch.no_grad():
        model.lstm.weight_hh_l1.add_(1.0)
    assert not torch.equal(model(tokens), before)


def test_weight_dropout_lstm_is_reported_not_fixed() -> None:
    model = WeightDropLSTM().eval()
    x = torch.randn(4, 1, 8)
    expected = model(x)[0]
    handle = flatten_object(model)
    assert any("ML402" in note for note in handle.notes)
    assert torch.equal(model(x)[0], expected)
    assert "ML402" in {f.code for f in memlayout.inspect(model).findings}


def test_channels_last_conv_stays_channels_last() -> None:
    model = ConvNet().eval()
    x = torch.randn(1, 3, 8, 8)
    expected = model(x)
    flatten_object(model)
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert model.conv2.weight.is_contiguous()
    assert torch.equal(model(x), expected)


def test_groups_split_by_requires_grad_and_dtype() -> None:
    model = ConvNet()
    model.conv2.bias.requires_grad_(False)
    handle = flatten_object(model)
    labels = {g.label for g in handle.groups}
    assert labels == {
        "params float32 cpu requires_grad",
        "params float32 cpu frozen",
        "tensors float32 cpu",
        "tensors int64 cpu",
    }


def test_flat_parameter_buffer_is_the_parameters_memory() -> None:
    model = TransposedTie()
    handle = flatten_object(model)
    (params,) = handle.parameter_groups()
    with torch.no_grad():
        params.data.mul_(2.0)
    assert torch.equal(model.encoder.bias, params.data[slice(*_slot(handle, "encoder.bias"))])


def _slot(handle: FlatHandle, name: str) -> tuple[int, int]:
    for placement in (p for _, p in handle.plan.placements.values()):
        if name in placement.names:
            return placement.offset, placement.offset + int(torch.Size(placement.shape).numel())
    raise KeyError(name)


def test_grads_get_a_parallel_flat_buffer() -> None:
    model = LstmLM()
    handle = flatten_object(model, grads=True)
    model(torch.randint(0, 50, (2, 3))).sum().backward()
    for group in handle.parameter_groups():
        assert group.grad is not None
    for param in model.parameters():
        owner = [g for g in handle.groups if g.data.untyped_storage().data_ptr() == param.untyped_storage().data_ptr()]
        assert param.grad is not None
        assert param.grad.untyped_storage().data_ptr() == owner[0].grad.untyped_storage().data_ptr()  # type: ignore[union-attr]
    total = torch.cat([g.grad for g in handle.parameter_groups()]).norm()  # type: ignore[misc]
    assert torch.allclose(total, torch.cat([p.grad.flatten() for p in model.parameters()]).norm())  # type: ignore[union-attr]


def test_share_memory_puts_buffers_in_shared_memory() -> None:
    model = TransposedTie()
    handle = flatten_object(model, share_memory=True)
    assert all(g.data.is_shared() for g in handle.groups)
    assert model.encoder.weight.is_shared()


def test_optimizer_built_before_flatten_still_updates_the_model() -> None:
    torch.manual_seed(0)
    model = TransposedTie()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    flatten_object(model)
    # A bias large enough that every ReLU is active, so every bias gets a gradient.
    with torch.no_grad():
        model.encoder.bias.fill_(10.0)
        before = model.encoder.bias.detach().clone()
    model(torch.randn(2, 6)).sum().backward()
    grad = model.encoder.bias.grad
    assert grad is not None and bool((grad != 0).all())
    optimizer.step()
    assert torch.equal(model.encoder.bias, before - grad)


def test_public_api_is_lazy_and_flattens_in_place() -> None:
    model = TransposedTie()
    handle = memlayout.flatten(model, align=128)
    assert handle.changed
    assert all(s.start % 128 == 0 for b in handle.plan.buffers for s in b.slots)
