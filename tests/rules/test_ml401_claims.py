"""ML401's claims about torch, each checked by calling torch (issue 26, defect 2).

ML401 says when cuDNN copies an RNN's weights on every call and when torch lays
them out on the way. On the CPU, the tests check the mechanism each claim rests on:
which loading paths call `flatten_parameters()` (the call that lays the weights
out for cuDNN on CUDA) and which leave the weights as they were. On a CUDA device
they check the outcome itself: whether cuDNN warns that it copies, beside the
severity memlayout gives the same module or file.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import memlayout
from memlayout import _torch
from memlayout.rules.registry import Finding, Severity

NOT_ONE_CHUNK = "not part of single contiguous chunk"


def make_lstm() -> nn.LSTM:
    torch.manual_seed(0)
    return nn.LSTM(6, 8, num_layers=2, bidirectional=True)


@pytest.fixture
def flatten_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[nn.RNNBase]]:
    """Every `flatten_parameters()` call torch makes on any RNN, recorded, then run as torch would."""
    calls: list[nn.RNNBase] = []
    original = nn.RNNBase.flatten_parameters

    def recording(self: nn.RNNBase) -> None:
        calls.append(self)
        original(self)

    monkeypatch.setattr(nn.RNNBase, "flatten_parameters", recording)
    yield calls


def ml401(target: object) -> list[Finding]:
    return [f for f in memlayout.inspect(target).findings if f.code == "ML401"]


# --- the mechanism, on the CPU ---------------------------------------------------


def test_moving_a_module_lays_its_weights_out(flatten_calls: list[nn.RNNBase]) -> None:
    # `.cuda()` and `.to()` both run RNNBase._apply; `.to(dtype)` runs it on the CPU.
    lstm = make_lstm()
    flatten_calls.clear()
    lstm.to(torch.float64)
    assert flatten_calls == [lstm]


def test_load_state_dict_copies_into_the_weights_the_module_already_has(tmp_path: Path) -> None:
    lstm = make_lstm()
    before = [w.data_ptr() for w in _torch.rnn_flat_weights(lstm)]
    torch.save(make_lstm().state_dict(), tmp_path / "sd.pt")
    lstm.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True))
    assert [w.data_ptr() for w in _torch.rnn_flat_weights(lstm)] == before


def test_after_assign_true_the_first_forward_lays_the_weights_out(
    tmp_path: Path, flatten_calls: list[nn.RNNBase]
) -> None:
    torch.save(make_lstm().state_dict(), tmp_path / "sd.pt")
    with torch.device("meta"):
        lstm = make_lstm()
    lstm.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True), assign=True)
    assert _torch.rnn_weights_replaced(lstm)
    flatten_calls.clear()
    lstm(torch.randn(3, 2, 6))
    assert flatten_calls == [lstm]
    assert not _torch.rnn_weights_replaced(lstm)


def test_unpickling_a_module_lays_nothing_out(tmp_path: Path, flatten_calls: list[nn.RNNBase]) -> None:
    torch.save(make_lstm(), tmp_path / "module.pt")
    flatten_calls.clear()
    lstm = torch.load(tmp_path / "module.pt", weights_only=False)
    assert flatten_calls == []
    assert not _torch.rnn_weights_replaced(lstm)  # so its forward does not lay them out either
    lstm(torch.randn(3, 2, 6))
    assert flatten_calls == []


def test_a_swapped_data_is_not_seen_as_a_replaced_weight() -> None:
    lstm = make_lstm()
    with torch.no_grad():
        lstm.weight_hh_l0.data = lstm.weight_hh_l0.data.clone()
    assert not _torch.rnn_weights_replaced(lstm)
    lstm.weight_hh_l0 = nn.Parameter(lstm.weight_hh_l0.detach().clone())
    assert _torch.rnn_weights_replaced(lstm)


# --- what memlayout says for each input ------------------------------------------


def test_a_state_dict_gets_a_note_not_a_warning(tmp_path: Path) -> None:
    torch.save(make_lstm().state_dict(), tmp_path / "sd.pt")
    (finding,) = ml401(str(tmp_path / "sd.pt"))
    assert finding.severity is Severity.INFO
    assert "assign=True" in finding.message and "copy per call" in finding.message


def test_a_pickled_module_gets_the_warning(tmp_path: Path) -> None:
    torch.save(make_lstm(), tmp_path / "module.pt")
    (finding,) = ml401(str(tmp_path / "module.pt"))
    assert finding.severity is Severity.WARNING
    assert 'map_location="cuda"' in finding.message


def test_the_pickled_module_warning_is_gone_once_its_hint_is_followed(tmp_path: Path) -> None:
    lstm = make_lstm()
    torch.save(lstm, tmp_path / "module.pt")
    memlayout.flatten(lstm)
    torch.save(lstm, tmp_path / "flat.pt")
    assert ml401(str(tmp_path / "flat.pt")) == []


def test_a_live_cpu_module_gets_a_note() -> None:
    (finding,) = ml401(make_lstm())
    assert finding.severity is Severity.INFO
    assert ".cuda()" in finding.message


# --- the outcome, where a CUDA device exists --------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cudnn_copies(lstm: nn.LSTM) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lstm(torch.randn(5, 3, 6, device="cuda"))[0].sum().backward()
    return any(NOT_ONE_CHUNK in str(w.message) for w in caught)


def _state_dict_paths(path: Path) -> dict[str, Callable[[], nn.LSTM]]:
    def cuda_then_load() -> nn.LSTM:
        lstm = make_lstm().cuda()
        lstm.load_state_dict(torch.load(path, weights_only=True))
        return lstm

    def meta_assign() -> nn.LSTM:
        with torch.device("meta"):
            lstm = make_lstm()
        lstm.load_state_dict(torch.load(path, map_location="cuda", weights_only=True), assign=True)
        return lstm

    return {"cuda-then-load": cuda_then_load, "meta-assign": meta_assign}


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("how", ["cuda-then-load", "meta-assign"])
def test_no_loading_path_of_a_state_dict_makes_cudnn_copy(tmp_path: Path, how: str) -> None:
    torch.save(make_lstm().state_dict(), tmp_path / "sd.pt")
    assert ml401(str(tmp_path / "sd.pt"))[0].severity is Severity.INFO
    assert not _cudnn_copies(_state_dict_paths(tmp_path / "sd.pt")[how]())


@cuda
@pytest.mark.gpu
def test_a_pickled_cpu_module_loaded_onto_cuda_makes_cudnn_copy(tmp_path: Path) -> None:
    torch.save(make_lstm(), tmp_path / "module.pt")
    assert ml401(str(tmp_path / "module.pt"))[0].severity is Severity.WARNING
    assert _cudnn_copies(torch.load(tmp_path / "module.pt", map_location="cuda", weights_only=False))


@cuda
@pytest.mark.gpu
def test_a_live_cuda_module_warns_exactly_when_cudnn_copies() -> None:
    swapped = make_lstm().cuda()
    with torch.no_grad():
        swapped.weight_hh_l0.data = swapped.weight_hh_l0.data.clone()
    assert ml401(swapped)[0].severity is Severity.WARNING
    assert _cudnn_copies(swapped)
    replaced = make_lstm().cuda()
    replaced.weight_hh_l0 = nn.Parameter(replaced.weight_hh_l0.detach().clone())
    assert ml401(replaced)[0].severity is Severity.INFO
    assert not _cudnn_copies(replaced)
