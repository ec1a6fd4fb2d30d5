"""Adopting the buffer cuDNN lays out (`flatten --device cuda`), shown on the CPU.

On CUDA, torch's own flatten path decides where each RNN weight goes. Here a
stand-in plays the part of a cuDNN whose layout differs from memlayout's
(weights in reverse order, with gaps), so the adoption itself is exercised:
the plan must describe what the stand-in did, the saved file must verify
against it, and values, outputs and sharing must survive. The real thing runs
in tests/flatten/test_gpu.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from memlayout.core.cudnn_layout import RnnGeometry
from memlayout.flatten.apply import (
    allocate,
    copy_from_storages,
    rebind,
    views_of,
    walk_tensors,
)
from memlayout.flatten.cudnn_adopt import adopt_cudnn_layouts
from memlayout.flatten.live import live_facts
from memlayout.flatten.plan import is_identity, plan_flatten
from memlayout.flatten.save import verify_torch_file, write_torch
from memlayout.load.live import storage_key

GAP = 16


class OtherCudnn:
    """Lays the weights out in reverse order, GAP elements apart, in a buffer of its own."""

    def __init__(self) -> None:
        self.calls: list[tuple[RnnGeometry, Any]] = []
        self.offsets: dict[int, int] = {}

    def __call__(self, weights: list[torch.Tensor], geometry: RnnGeometry, module: Any) -> None:
        self.calls.append((geometry, module))
        buffer = torch.zeros(sum(w.numel() + GAP for w in weights) + GAP, dtype=weights[0].dtype)
        offset = GAP
        with torch.no_grad():
            for weight in reversed(weights):
                count = weight.numel()
                buffer[offset : offset + count].copy_(weight.reshape(-1))
                weight.data = buffer[offset : offset + count].view_as(weight)
                self.offsets[id(weight)] = offset
                offset += count + GAP


class Tagger(nn.Module):
    """An embedding, a 2-layer bidirectional GRU and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.gru = nn.GRU(6, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(10, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.embed(tokens))[0])


def _flatten_with(obj: Any, flatten: Any) -> tuple[Any, list[torch.Tensor], list[str]]:
    # The steps flatten's writers take, with the RNN layout handed to `flatten`.
    facts = live_facts(obj)
    plan = plan_flatten(facts)
    buffers = allocate(plan)
    copy_from_storages(plan, buffers, {storage_key(t): t.untyped_storage() for t in walk_tensors(obj)})
    rebind(obj, plan, views_of(plan, buffers), storage_key)
    return adopt_cudnn_layouts(obj, plan, buffers, facts, flatten=flatten, device_types=("cpu",))


def _assert_plan_describes(plan: Any, buffers: list[torch.Tensor], model: nn.Module) -> None:
    params = dict(model.named_parameters())
    for key, view in views_of(plan, buffers).items():
        (_, placement) = plan.placements[key]
        for name in placement.names:
            assert params[name].data_ptr() == view.data_ptr(), name
            assert params[name].stride() == view.stride(), name


def test_the_plan_and_the_saved_file_follow_the_layout_cudnn_chose(tmp_path: Path) -> None:
    model = Tagger().eval()
    tokens = torch.randint(0, 20, (2, 7))
    expected = model(tokens)
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    other = OtherCudnn()
    plan, buffers, notes = _flatten_with(model, other)
    assert notes == []
    (call,) = other.calls
    assert call[1] is model.gru  # a live module goes through its own flatten_parameters()
    assert (call[0].mode, call[0].num_layers, call[0].bidirectional) == ("GRU", 2, True)
    for weight in model.gru._flat_weights:
        assert weight.storage_offset() == other.offsets[id(weight)]
    assert all(torch.equal(p, values[n]) for n, p in model.named_parameters())
    assert torch.equal(model(tokens), expected)
    # The adopted plan describes the model exactly as it now is...
    _assert_plan_describes(plan, buffers, model)
    (rnn_buffer,) = [b for b in plan.buffers if b.rnn_module == "gru"]
    assert rnn_buffer.nbytes == model.gru.weight_ih_l0.untyped_storage().nbytes()
    # ...and the saved file verifies against it, byte for byte.
    write_torch(model.state_dict(), str(tmp_path / "out.pt"), lambda t: verify_torch_file(t, plan, buffers))
    saved = torch.load(tmp_path / "out.pt", weights_only=True)
    assert saved["gru.weight_hh_l1_reverse"].storage_offset() == model.gru.weight_hh_l1_reverse.storage_offset()


def test_a_state_dict_rnn_is_laid_out_without_a_module_and_aliases_follow() -> None:
    lstm = nn.LSTM(4, 3, num_layers=2, proj_size=2)
    state = lstm.state_dict()
    # A second tensor object viewing the same memory as one weight, as a checkpoint may hold.
    checkpoint = {"model": state, "ema": {"w": state["weight_hh_l1"].detach()}}
    other = OtherCudnn()
    _, _, notes = _flatten_with(checkpoint, other)
    assert notes == []
    ((geometry, module),) = other.calls
    assert module is None and geometry.proj_size == 2 and geometry.mode == "LSTM"
    assert checkpoint["ema"]["w"].data_ptr() == state["weight_hh_l1"].data_ptr()
    assert torch.equal(checkpoint["ema"]["w"], state["weight_hh_l1"])


def test_when_torch_leaves_the_rnn_alone_memlayouts_layout_is_kept() -> None:
    model = Tagger()

    def leaves_it(weights: list[torch.Tensor], geometry: RnnGeometry, module: Any) -> None:
        return None  # as flatten_parameters() does for a dtype cuDNN does not accept

    plan, buffers, notes = _flatten_with(model, leaves_it)
    assert notes == ["GRU gru: torch's cuDNN flatten left it alone; memlayout's layout kept"]
    _assert_plan_describes(plan, buffers, model)
    facts = live_facts(model)
    assert is_identity(plan_flatten(facts), facts)


def test_re_pointing_an_rnn_leaves_its_layout_to_the_adopt_step(monkeypatch: Any) -> None:
    # On CUDA, flatten_parameters() copies every weight into a new cuDNN buffer. Run
    # while re-pointing (as RNNBase._init_flat_weights would), it left the weights
    # outside memlayout's buffer before the adopt step looked for them there: the
    # KeyError an H200 showed for every live LSTM flattened onto CUDA.
    calls: list[nn.RNNBase] = []
    monkeypatch.setattr(nn.RNNBase, "flatten_parameters", lambda self: calls.append(self))
    import memlayout

    lstm = nn.LSTM(6, 8, num_layers=2, bidirectional=True)
    calls.clear()  # building an RNN lays it out too
    handle = memlayout.flatten(lstm)
    assert calls == []
    (group,) = handle.groups
    assert lstm.weight_ih_l0.untyped_storage().data_ptr() == group.data.untyped_storage().data_ptr()
