"""CUDA paths: cuDNN uses flattened RNN weights in place; the GPU holds the model once."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from memlayout.flatten.files import FlattenOptions, flatten_path
from memlayout.flatten.live import flatten_object
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
