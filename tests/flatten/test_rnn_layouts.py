"""RNNs of every shape cuDNN runs: ML401 and flatten agree with cuDNN's layout.

The expected layout here is built the way ONNX's OptimizedRNN and MXNet's fused
RNN describe cuDNN's buffer (`tests.models.cudnn_buffer_order`), not by the
layout module under test; that description is checked against files cuDNN wrote
in tests/realworld/test_rnn_layout.py, and against live `flatten_parameters()`
on a GPU in tests/flatten/test_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import memlayout
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.live import flatten_object
from tests.models import cudnn_buffer_order, pack_into_one_buffer, pack_like_cudnn

INPUT, HIDDEN, PROJ = 3, 4, 2


def _case(mode: str, layers: int, bidirectional: bool, bias: bool, proj: int) -> Callable[[], nn.RNNBase]:
    def build() -> nn.RNNBase:
        kwargs = {"num_layers": layers, "bidirectional": bidirectional, "bias": bias}
        if mode == "LSTM":
            return nn.LSTM(INPUT, HIDDEN, proj_size=proj, **kwargs)
        if mode == "GRU":
            return nn.GRU(INPUT, HIDDEN, **kwargs)
        return nn.RNN(INPUT, HIDDEN, nonlinearity="relu" if mode == "RNN_RELU" else "tanh", **kwargs)

    return build


CASES = {
    f"{mode}-l{layers}{'-bi' if bi else ''}{'' if bias else '-nobias'}{f'-proj{proj}' if proj else ''}": _case(
        mode, layers, bi, bias, proj
    )
    for mode in ("LSTM", "GRU", "RNN_TANH")
    for layers in (1, 2, 3)
    for bi in (False, True)
    for bias in (True, False)
    for proj in ((0, PROJ) if mode == "LSTM" else (0,))
}
CASES["RNN_RELU-l2-bi"] = _case("RNN_RELU", 2, True, True, 0)


def _ml401(target: object) -> list[str]:
    return [f.message for f in memlayout.inspect(target).findings if f.code == "ML401"]


def _expected_offsets(rnn: nn.RNNBase) -> tuple[dict[str, int], int]:
    offsets, cursor = {}, 0
    for entry in cudnn_buffer_order(rnn):
        if isinstance(entry, str):
            offsets[entry] = cursor
            cursor += getattr(rnn, entry).numel()
        else:
            cursor += entry
    return offsets, cursor


def _assert_cudnn_layout(rnn: nn.RNNBase) -> None:
    offsets, total = _expected_offsets(rnn)
    storage = rnn.weight_ih_l0.untyped_storage()
    for name, offset in offsets.items():
        weight = getattr(rnn, name)
        assert weight.untyped_storage().data_ptr() == storage.data_ptr(), name
        assert weight.storage_offset() == offset, name
        assert weight.is_contiguous(), name
    assert storage.nbytes() == total * rnn.weight_ih_l0.element_size()


def _inputs(rnn: nn.RNNBase) -> torch.Tensor:
    return torch.randn(5, 2, INPUT, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_ml401_passes_exactly_cudnn_layout(build: Callable[[], nn.RNNBase]) -> None:
    fresh = build()
    # As constructed on the CPU: one storage per weight.
    assert _ml401(fresh) and _ml401(fresh.state_dict())
    # One chunk in parameter-name order (w_ih, w_hh, b_ih, b_hh, w_hr per layer) is
    # where cuDNN wants the weights only for one unidirectional layer with biases
    # and no projection; without biases cuDNN still needs the bias space.
    names_order = build()
    pack_into_one_buffer([getattr(names_order, n) for n in names_order._flat_weights_names])
    same_order = names_order.num_layers == 1 and not names_order.bidirectional
    same_order = same_order and names_order.bias and not names_order.proj_size
    assert bool(_ml401(names_order)) != same_order
    # Packed as cuDNN lays its buffer out: silent, as a module and as a state dict.
    packed = build()
    pack_like_cudnn(packed)
    assert _ml401(packed) == [] and _ml401(packed.state_dict()) == []
    # The same buffer after another tensor: cuDNN reads from element 0.
    shifted = build()
    pack_like_cudnn(shifted, start=8)
    (message,) = _ml401(shifted)
    assert "weight weight_ih_l0 is at element 8; cuDNN expects it at element 0" in message


@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_flatten_lays_rnn_out_like_cudnn_with_values_and_outputs_unchanged(
    build: Callable[[], nn.RNNBase], tmp_path: Path
) -> None:
    rnn = build().eval()
    x = _inputs(rnn)
    values = {n: getattr(rnn, n).detach().clone() for n in rnn._flat_weights_names}
    expected = rnn(x)[0]
    flatten_object(rnn)
    _assert_cudnn_layout(rnn)
    assert all(torch.equal(getattr(rnn, n), v) for n, v in values.items())
    assert torch.equal(rnn(x)[0], expected)
    findings = {f.code for f in memlayout.inspect(rnn).findings}
    assert not findings & {"ML301", "ML401"}

    # From a file: flatten writes cuDNN's layout, and load_flat keeps it in a fresh model.
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(build().state_dict() | values, src)
    flatten_path(str(src), FlattenOptions(out=str(out), device="cpu"))
    assert _ml401(str(out)) == []
    fresh = build().eval()
    memlayout.load_flat(fresh, str(out))
    _assert_cudnn_layout(fresh)
    assert all(torch.equal(getattr(fresh, n), v) for n, v in values.items())
    assert torch.equal(fresh(x)[0], expected)


def test_load_flat_from_safetensors_gives_the_rnn_cudnns_layout(tmp_path: Path) -> None:
    # A flat safetensors file is one mapped data section with no holes, so the RNN
    # (bias space and all) gets its own buffer when loaded.
    from safetensors.torch import save_file

    build = CASES["LSTM-l2-bi-nobias-proj2"]
    rnn = build().eval()
    x = _inputs(rnn)
    expected = rnn(x)[0]
    save_file({k: v.contiguous() for k, v in rnn.state_dict().items()}, tmp_path / "in.safetensors")
    flatten_path(str(tmp_path / "in.safetensors"), FlattenOptions(out=str(tmp_path / "out.safetensors"), device="cpu"))
    fresh = build().eval()
    memlayout.load_flat(fresh, str(tmp_path / "out.safetensors"))
    _assert_cudnn_layout(fresh)
    assert torch.equal(fresh(x)[0], expected)
