"""A model that calls `module.to(...)` in its own forward (module_conversions.py), against torch and a real step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memlayout.activations as act
from memlayout import _torch
from tests.activations.measure import allocator_peak_step


class _CastsItsRouter(nn.Module):
    """As NllbMoe's and SwitchTransformers' routers do: `self.classifier = self.classifier.to(self.dtype)`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.classifier = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(self.embed.weight.dtype)
        self.classifier.float()
        return self.classifier(torch.relu(self.embed(x))).square().mean()


def test_torch_cannot_swap_a_fake_parameter_even_for_a_conversion_that_changes_nothing() -> None:
    # Why module_conversions.py exists: if a torch release lets this pass, it can go.
    with _torch.FakeTensorMode():
        layer = nn.Linear(3, 4)
        with pytest.raises(RuntimeError, match=r"Couldn't swap Linear\.weight"):
            layer.to(torch.float32)


def test_a_model_that_converts_a_module_to_its_own_dtype_in_forward_is_traced_as_its_real_step() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 32)
    report = act.analyze(_CastsItsRouter(), [x])
    real = allocator_peak_step(_CastsItsRouter(), (x,), {})
    assert report.summary.peak_bytes == pytest.approx(real.peak_bytes, rel=0.02)


def test_a_model_that_converts_a_module_to_another_dtype_in_forward_is_traced_as_its_real_step() -> None:
    # The swap goes through once the fake mode forgets its conversion into the parameter (peft's adapters on a
    # bf16 step do this); the step then holds the float64 weights a real step holds.
    class Doubles(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(32, 64)
            self.layer = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.layer.double()
            return self.layer(torch.relu(self.embed(x)).double()).square().mean()

    torch.manual_seed(0)
    x = torch.randn(16, 32)
    report = act.analyze(Doubles(), [x])
    real = allocator_peak_step(Doubles(), (x,), {})
    assert report.summary.peak_bytes == pytest.approx(real.peak_bytes, rel=0.02)
