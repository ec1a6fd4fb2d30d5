"""Where meta kernels differ from the real CPU kernels, checked against the real kernels."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memlayout.activations.trace.kernels import corrected_output_nbytes, onednn_lstm_workspace_bytes

MKLDNN_RNN = getattr(torch.ops.aten, "mkldnn_rnn_layer", None)


class _Workspaces(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int | None]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mkldnn_rnn_layer.default:
            predicted = (corrected_output_nbytes(func, args, kwargs or {}) or {}).get(3)
            self.seen.append((out[3].untyped_storage().nbytes(), predicted))
        return out


@pytest.mark.skipif(MKLDNN_RNN is None or not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
@pytest.mark.parametrize(
    "steps, batch, input_size, hidden, layers, bidirectional, batch_first",
    [
        *((t, b, i, h, 1, False, True) for t, b, i, h in itertools.product((1, 7), (1, 5), (7, 128), (16, 100, 256))),
        (12, 3, 40, 64, 2, True, False),
        (9, 4, 33, 250, 3, False, True),
    ],
)
def test_onednn_lstm_workspace_is_the_real_kernels(
    steps: int, batch: int, input_size: int, hidden: int, layers: int, bidirectional: bool, batch_first: bool
) -> None:
    lstm = torch.nn.LSTM(input_size, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    shape = (batch, steps, input_size) if batch_first else (steps, batch, input_size)
    with _Workspaces() as mode:
        lstm(torch.randn(shape))
    assert mode.seen, "the LSTM did not run through oneDNN"
    for real, predicted in mode.seen:
        assert predicted == real


def test_workspace_formula_pages() -> None:
    # seven regions, each page aligned: the smallest problem still takes seven pages
    assert onednn_lstm_workspace_bytes(1, 1, 1, 1) == 7 * 4096
