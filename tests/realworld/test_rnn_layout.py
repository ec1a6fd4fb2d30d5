"""cuDNN's RNN layout, checked against files that cuDNN itself flattened during training.

Each file below was saved from a CUDA model after `flatten_parameters()`, so its
RNN weights are views of the one buffer cuDNN laid out. The expected offsets are
read from the file with `torch.load`, never typed in: the layout module must
reproduce every weight's offset and the buffer's length from the weights' shapes,
ML401 must stay silent, and flatten must keep the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import memlayout
from memlayout.core.cudnn_layout import RnnGeometry, cudnn_layout, geometry_from_shapes
from memlayout.flatten.files import FlattenOptions, flatten_path
from tests.cudnn.record_cudnn_layouts import differences

# corpus name -> (the RNN's prefix in the loaded tree, the mode its gate multiple shows)
CUDNN_WRITTEN = {
    "resemblyzer": ("model_state.lstm.", "LSTM"),  # 3 layers, unidirectional, cuDNN 7 era
    "beatnet-weights": ("lstm.", "LSTM"),  # 2 layers
    "medaka-hac-v6": ("gru.", "GRU"),  # 2 layers, bidirectional, recent torch
    "medaka-sup-v5.2": ("gru.", "GRU"),
}


def _rnn_weights(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    tree = torch.load(path, map_location="cpu", weights_only=True)
    for key in prefix.split(".")[:-2]:
        tree = tree[key]
    local = prefix.split(".")[-2] + "."
    return {name[len(local):]: tensor for name, tensor in tree.items() if name.startswith(local)}


@pytest.mark.parametrize("name", sorted(CUDNN_WRITTEN))
def test_layout_reproduces_every_offset_cudnn_wrote(name: str, realworld: Callable[[str], Path]) -> None:
    prefix, mode = CUDNN_WRITTEN[name]
    weights = _rnn_weights(realworld(name), prefix)
    geometry = geometry_from_shapes(None, {n: tuple(w.shape) for n, w in weights.items()})
    assert isinstance(geometry, RnnGeometry), geometry
    assert geometry.mode == mode
    layout = cudnn_layout(geometry)
    storages = {w.untyped_storage().data_ptr() for w in weights.values()}
    assert len(storages) == 1, "cuDNN flattened these weights into one buffer"
    for slot in layout.slots:
        assert weights[slot.name].storage_offset() == slot.offset, slot.name
        assert tuple(weights[slot.name].shape) == slot.shape
    (any_weight, *_) = weights.values()
    assert any_weight.untyped_storage().nbytes() // any_weight.element_size() == layout.numel


def test_resemblyzer_offsets_are_the_ones_the_issue_reports(realworld: Callable[[str], Path]) -> None:
    # Read from the file: every matrix first, layer by layer, then every bias.
    weights = _rnn_weights(realworld("resemblyzer"), "model_state.lstm.")
    offsets = {name: weights[name].storage_offset() for name in weights}
    matrices = [offsets[f"{kind}_l{layer}"] for layer in range(3) for kind in ("weight_ih", "weight_hh")]
    biases = [offsets[f"{kind}_l{layer}"] for layer in range(3) for kind in ("bias_ih", "bias_hh")]
    assert matrices == sorted(matrices) and biases == sorted(biases)
    assert max(matrices) < min(biases)
    layout = cudnn_layout(RnnGeometry("LSTM", input_size=40, hidden_size=256, num_layers=3))
    assert {slot.name: slot.offset for slot in layout.slots} == offsets


@pytest.mark.parametrize("name", sorted(CUDNN_WRITTEN))
def test_ml401_is_silent_on_weights_cudnn_flattened(name: str, realworld: Callable[[str], Path]) -> None:
    report = memlayout.inspect(str(realworld(name)))
    assert "ML401" not in {f.code for f in report.findings}
    (module,) = [m for m in report.facts.modules if m.rnn is not None]
    assert module.rnn is not None and module.rnn.mode == CUDNN_WRITTEN[name][1]


def test_pickled_lstm_module_that_cudnn_flattened_is_silent(realworld: Callable[[str], Path]) -> None:
    # BeatNet also ships the whole pickled model (classes from its own code, never imported here).
    report = memlayout.inspect(str(realworld("beatnet-module")))
    (module,) = [m for m in report.facts.modules if m.rnn is not None]
    assert module.class_name == "torch.nn.modules.rnn.LSTM"
    assert "ML401" not in {f.code for f in report.findings}


def test_ml401_fires_on_the_same_gru_saved_per_parameter(realworld: Callable[[str], Path]) -> None:
    # medaka's variant model was saved from the CPU: one storage per weight, as cuDNN cannot use.
    weights = _rnn_weights(realworld("medaka-hac-variant-v5"), "gru.")
    assert len({w.untyped_storage().data_ptr() for w in weights.values()}) == len(weights) == 16
    (finding,) = [f for f in memlayout.inspect(str(realworld("medaka-hac-variant-v5"))).findings if f.code == "ML401"]
    assert finding.message.startswith("GRU gru: its 16 weights live in 16 separate storages")




@pytest.mark.parametrize("name", sorted(CUDNN_WRITTEN))
def test_flatten_keeps_the_layout_cudnn_wrote(name: str, realworld: Callable[[str], Path], tmp_path: Path) -> None:
    prefix, _ = CUDNN_WRITTEN[name]
    source = realworld(name)
    if name == "resemblyzer":
        # A legacy-format file: re-save it as a zip with torch's own writer, which
        # keeps every storage whole and every view's offset.
        zipped = tmp_path / "pretrained.pt"
        torch.save(torch.load(source, map_location="cpu", weights_only=True), zipped)
        source = zipped
    before = _rnn_weights(source, prefix)
    out = tmp_path / "flat.pt"
    flatten_path(str(source), FlattenOptions(out=str(out), device="cpu"))
    after = _rnn_weights(out, prefix)
    assert after.keys() == before.keys()
    assert len({w.untyped_storage().data_ptr() for w in after.values()}) == 1
    for weight_name, weight in before.items():
        assert after[weight_name].storage_offset() == weight.storage_offset(), weight_name
        assert torch.equal(after[weight_name], weight)
    (any_before, *_), (any_after, *_) = before.values(), after.values()
    assert any_after.untyped_storage().nbytes() == any_before.untyped_storage().nbytes()
    assert "ML401" not in {f.code for f in memlayout.inspect(str(out)).findings}
    # Nothing about the RNN is among what --check would change.
    check = flatten_path(str(source), FlattenOptions(out=None, check=True))
    assert not [line for line in check.changes if prefix in line]


def test_the_gpu_table_check_accepts_what_cudnn_wrote_and_rejects_a_moved_weight(
    realworld: Callable[[str], Path],
) -> None:
    # A GPU-recorded table is checked by `differences`; fed a file cuDNN wrote, in the
    # table's own shape, it must agree, and must notice one weight moved.
    weights = _rnn_weights(realworld("medaka-hac-v6"), "gru.")
    geometry = geometry_from_shapes(None, {n: tuple(w.shape) for n, w in weights.items()})
    assert isinstance(geometry, RnnGeometry)
    any_weight = weights["weight_ih_l0"]
    case = {
        "mode": geometry.mode, "input_size": geometry.input_size, "hidden_size": geometry.hidden_size,
        "num_layers": geometry.num_layers, "bidirectional": geometry.bidirectional, "bias": geometry.bias,
        "proj_size": geometry.proj_size, "one_storage": True,
        "offsets": {n: w.storage_offset() for n, w in weights.items()},
        "numel": any_weight.untyped_storage().nbytes() // any_weight.element_size(),
    }
    assert differences(case) == []
    case["offsets"] = {**case["offsets"], "weight_ih_l1": 0}
    where = weights["weight_ih_l1"].storage_offset()
    assert differences(case) == [f"weight_ih_l1: cuDNN put it at 0, memlayout at {where}"]
