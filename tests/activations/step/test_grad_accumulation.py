"""Gradients summed for one input: in place in the user's step, as torch's engine does with no dispatch mode.

The judge is the CPU allocator's own events, in a step with no dispatch mode active: the storage counter and
MemTracker are dispatch modes, and under any mode torch's engine sums out of place (grad_accumulation.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import memlayout.activations as act
from tests.activations.measure import allocator_peak_step


class ManyViews(nn.Module):
    """A recurrence over 16 slices of one projection: backward sums a full-size gradient for each slice."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 16 * 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).view(x.shape[0], 16, 256)
        state = torch.zeros_like(h[:, 0])
        for i in range(16):
            state = state * 0.5 + h[:, i]
        return state.square().sum()


class TiedEmbedding(nn.Module):
    """An embedding tied to the output projection, few tokens: the weight's two gradients are summed at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8192, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.embed(ids) @ self.embed.weight.T
        return logits.logsumexp(-1).sum()


class Passing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def _real_peak(model: nn.Module, args: tuple[torch.Tensor, ...], under_a_mode: bool) -> int:
    torch.manual_seed(0)
    if not under_a_mode:
        return allocator_peak_step(model, args, {}, optimizer="none").peak_bytes
    from tests.activations import measure

    original = measure.run_step

    def under_mode(*a, **k):  # type: ignore[no-untyped-def]
        with Passing():
            return original(*a, **k)

    measure.run_step = under_mode
    try:
        return allocator_peak_step(model, args, {}, optimizer="none").peak_bytes
    finally:
        measure.run_step = original


def test_the_engine_sums_in_place_without_a_mode_and_out_of_place_under_one() -> None:
    # the claim grad_accumulation.py rests on, checked on torch itself: one slice-sized gradient apart
    def peak(under_a_mode: bool) -> int:
        torch.manual_seed(0)
        return _real_peak(ManyViews(), (torch.randn(64, 64),), under_a_mode)

    assert peak(under_a_mode=True) - peak(under_a_mode=False) == 64 * 16 * 256 * 4


@pytest.mark.parametrize(("build", "spec", "args"), [
    (ManyViews, "float32[64,64]", lambda: (torch.randn(64, 64),)),  # summed in place
    (TiedEmbedding, "int64[1,4]<8192", lambda: (torch.randint(0, 8192, (1, 4)),)),  # through a view: not
])
def test_a_step_that_sums_gradients_is_predicted_as_the_user_runs_it(build: Any, spec: str, args: Any) -> None:
    torch.manual_seed(0)
    predicted = act.analyze(build(), [spec], optimizer="none").summary.peak_bytes
    torch.manual_seed(0)
    real = _real_peak(build(), args(), under_a_mode=False)
    assert abs(predicted - real) <= 0.02 * real, (predicted, real)


@pytest.mark.cuda_build
@pytest.mark.parametrize(("build", "spec"), [(ManyViews, "float32[64,64]"), (TiedEmbedding, "int64[1,4]<8192")])
def test_the_gpu_free_backward_sums_as_torchs_engine_does(build: Any, spec: str) -> None:
    """memlayout's own backward loop (fake CUDA tensors, no GPU) follows the same rule as the CPU trace: the two
    devices' steps agree on these models, whose tensors are all multiples of the CUDA allocator's 512 bytes."""
    cpu = act.analyze(build(), [spec], optimizer="none").summary.peak_bytes
    cuda = act.analyze(build(), [spec], optimizer="none", device="cuda").summary.peak_bytes
    assert cuda == cpu


class GathersScores(nn.Module):
    """Gathers from a score matrix, as DeBERTa's and SEW-D's disentangled attention do: `gather_backward` fills a
    fresh zero tensor with `scatter_add_`, in place only with no dispatch mode."""

    def __init__(self) -> None:
        super().__init__()
        self.scores = nn.Linear(64, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.scores(x)
        index = torch.arange(x.shape[1]).expand(x.shape[0], x.shape[1])[..., None].expand(-1, -1, 128)
        return torch.gather(scores, -1, index).square().sum()


def test_a_backward_formula_fills_its_zeros_in_place_without_a_mode_and_memlayout_follows() -> None:
    x = torch.randn(16, 24, 64)
    under_a_mode = _real_peak(GathersScores(), (x,), under_a_mode=True)
    real = _real_peak(GathersScores(), (x,), under_a_mode=False)
    assert under_a_mode - real == 16 * 24 * 512 * 4  # the formula's second result, on torch itself
    torch.manual_seed(0)
    predicted = act.analyze(GathersScores(), [x], optimizer="none").summary.peak_bytes
    assert predicted == real
