"""cuDNN's RNN layout module on torch's own modules: shapes, names and modes.

Its offsets are checked against files cuDNN wrote in tests/realworld/test_rnn_layout.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import memlayout
from memlayout.core.cudnn_layout import (
    INFERRED_RNN_LABEL,
    RnnGeometry,
    geometry_from_shapes,
    weight_shapes,
)
from tests.cudnn.record_cudnn_layouts import differences


@pytest.mark.parametrize(
    ("module", "label"),
    [
        (torch.nn.LSTM(5, 6, num_layers=2, bidirectional=True), "LSTM"),
        (torch.nn.LSTM(5, 6, proj_size=3), "LSTM"),
        (torch.nn.GRU(5, 6, num_layers=3, bias=False), "GRU"),
        (torch.nn.RNN(5, 6, nonlinearity="relu"), INFERRED_RNN_LABEL),
        (torch.nn.RNN(5, 6, num_layers=2, bidirectional=True), INFERRED_RNN_LABEL),
    ],
    ids=["lstm-bidir", "lstm-proj", "gru-nobias", "rnn-relu", "rnn-tanh-bidir"],
)
def test_rnn_recognised_from_a_state_dict_is_labelled_by_its_gate_multiple(
    module: torch.nn.RNNBase, label: str
) -> None:
    (record,) = memlayout.inspect(module.state_dict()).facts.modules
    assert record.class_name == f"(inferred from names) {label}"
    assert record.rnn is not None and record.rnn.flat_weight_names == tuple(module._flat_weights_names)


def test_names_whose_shapes_no_rnn_has_are_not_taken_for_one() -> None:
    # weight_ih rows are 5 x the hidden size: no torch RNN has 5 gates.
    state = {"cell.weight_ih_l0": torch.randn(30, 4), "cell.weight_hh_l0": torch.randn(30, 6)}
    assert memlayout.inspect(state).facts.modules == ()


@pytest.mark.parametrize(
    "module",
    [
        torch.nn.LSTM(3, 5, num_layers=3, bidirectional=True, proj_size=2, bias=False),
        torch.nn.GRU(4, 7, num_layers=2, bidirectional=True),
        torch.nn.RNN(2, 3, num_layers=3, nonlinearity="relu", bias=False),
    ],
    ids=["lstm", "gru", "rnn"],
)
def test_geometry_from_a_torch_module_builds_the_same_weights(module: torch.nn.RNNBase) -> None:
    shapes = {name: tuple(getattr(module, name).shape) for name in module._flat_weights_names}
    geometry = geometry_from_shapes(module.mode, shapes)
    assert isinstance(geometry, RnnGeometry)
    assert (geometry.input_size, geometry.hidden_size, geometry.num_layers) == (
        module.input_size, module.hidden_size, module.num_layers
    )
    assert (geometry.bidirectional, geometry.bias, geometry.proj_size) == (
        module.bidirectional, module.bias, module.proj_size
    )
    # torch's own parameter list, names, order and shapes, is what the geometry rebuilds.
    assert list(weight_shapes(geometry).items()) == list(shapes.items())


TABLES = Path(__file__).parent.parent / "cudnn" / "tables"


def test_layout_matches_every_table_recorded_on_a_gpu() -> None:
    tables = sorted(TABLES.glob("*.json"))
    if not tables:
        pytest.skip(
            "no cuDNN layout table recorded yet: run tests/cudnn/record_cudnn_layouts.py on a CUDA machine "
            "and commit its output under tests/cudnn/tables/"
        )
    for table in tables:
        recorded = json.loads(table.read_text())
        for case in recorded["cases"]:
            assert differences(case) == [], (table.name, case)
