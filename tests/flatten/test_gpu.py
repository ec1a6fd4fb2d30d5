"""CUDA paths: cuDNN uses flattened RNN weights in place; the GPU holds the model once;
memlayout's cuDNN layout is what the installed cuDNN does."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import memlayout
from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.live import flatten_object
from tests.cudnn.record_cudnn_layouts import (
    build,
    differences,
    grid,
    pack_by_layout_module,
    record_case,
)
from tests.flatten.models import LstmLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_flattened_lstm_runs_without_cudnn_weight_copy_warning() -> None:
    model = LstmLM()
    flatten_object(model, device="cuda")
    tokens = torch.randint(0, 50, (2, 9), device="cuda")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not part of single contiguous chunk.*")
        model(tokens).sum().backward()


def test_streaming_to_cuda_peaks_at_the_flat_bytes(tmp_path: Path) -> None:
    state = {f"w{i}": torch.randn(256, 1024) for i in range(32)}
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(state, src)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = flatten_path(str(src), FlattenOptions(out=str(out), device="cuda", verify=False))
    flat = result.bytes_after
    assert torch.cuda.max_memory_allocated() - base <= 1.02 * flat
    loaded = torch.load(out, map_location="cpu", weights_only=True)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


CUDNN_GRID = grid()
NOT_ONE_CHUNK = ".*not part of single contiguous chunk.*"


def _offsets(module: torch.nn.RNNBase) -> dict[str, int]:
    return {name: int(getattr(module, name).storage_offset()) for name in module._flat_weights_names}


@pytest.mark.parametrize("case", CUDNN_GRID, ids=[json.dumps(c, sort_keys=True) for c in CUDNN_GRID])
def test_layout_module_matches_flatten_parameters(case: dict[str, Any]) -> None:
    # What the cuDNN installed does, against memlayout.core.cudnn_layout, for every grid case.
    assert differences(record_case(case)) == []


@pytest.mark.parametrize("case", CUDNN_GRID, ids=[json.dumps(c, sort_keys=True) for c in CUDNN_GRID])
def test_cudnn_runs_in_place_from_the_layout_memlayout_builds(case: dict[str, Any]) -> None:
    # try_get_weight_buf itself: weights packed where the layout module says run with no copy.
    module = build(case)
    pack_by_layout_module(module)
    assert "ML401" not in {f.code for f in memlayout.inspect(module).findings}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=NOT_ONE_CHUNK)
        module(torch.randn(4, 2, case["input_size"], device="cuda"))[0].sum().backward()


def test_flatten_device_cuda_adopts_the_buffer_cudnn_lays_out(tmp_path: Path) -> None:
    lstm = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True, proj_size=3)
    src, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({"lstm": lstm.state_dict()}, src)
    flatten_path(str(src), FlattenOptions(out=str(out), device="cuda"))
    saved = torch.load(out, map_location="cuda", weights_only=True)["lstm"]
    reference = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True, proj_size=3).cuda()
    reference.flatten_parameters()
    assert {n: int(saved[n].storage_offset()) for n in reference._flat_weights_names} == _offsets(reference)
    assert len({t.untyped_storage().data_ptr() for t in saved.values()}) == 1
    assert all(torch.equal(saved[n].cpu(), v) for n, v in lstm.state_dict().items())


def test_live_flatten_on_cuda_keeps_the_buffer_flatten_parameters_made() -> None:
    model = LstmLM()
    handle = flatten_object(model, device="cuda")
    (group,) = [g for g in handle.groups if g.rnn_module == "lstm"]
    assert model.lstm.weight_ih_l0.untyped_storage().data_ptr() == group.data.data_ptr()
    reference = LstmLM().cuda()
    reference.lstm.flatten_parameters()
    assert _offsets(model.lstm) == _offsets(reference.lstm)
