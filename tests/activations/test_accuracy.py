"""The prediction on fake tensors against a real CPU step measured by PyTorch's MemTracker.

Goal (issue 13): peak_bytes within 2% of MemTracker, activation_bytes within 2%
of what a saved_tensors_hooks pack hook sees, once per storage. The larger
sizes are measured in benchmarks/accuracy/bench_activations.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import memlayout.activations as act
from tests.activations import edge_models, models
from tests.activations.measure import (
    allocator_peak_step,
    memtracker_step,
    saved_bytes_seen_by_pack_hook,
)

CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "gpt2": (lambda: models.gpt2(), lambda: models.token_inputs(4, 32, 500)),
    "bert": (lambda: models.bert(), lambda: models.token_inputs(4, 32, 500)),
    "llama": (lambda: models.llama(), lambda: models.token_inputs(4, 32, 500)),
    "flat-cnn": (lambda: models.flat_cnn(), lambda: models.image_inputs(4, 32)),
    "lstm-lm": (lambda: models.lstm_lm(), lambda: models.token_inputs(4, 32, 500, labels=False)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fake_prediction_matches_the_allocator_events_of_a_real_step(case: str) -> None:
    """Judged by the CPU allocator's own events, which see kernel scratch (the CNN's oneDNN convolutions)."""
    build, make_inputs = CASES[case]
    args, kwargs = make_inputs()
    report = act.analyze(build(), list(args), kwargs=kwargs)
    real = allocator_peak_step(build(), args, kwargs)
    assert report.mode == "fake"
    assert abs(report.summary.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes, (
        report.summary.peak_bytes, real.peak_bytes)
    seen = saved_bytes_seen_by_pack_hook(build(), args, kwargs)
    assert abs(report.summary.activation_bytes - seen) <= 0.02 * seen, (report.summary.activation_bytes, seen)


def test_real_mode_measures_the_same_step_as_memtracker() -> None:
    args, kwargs = models.token_inputs(2, 32, 500)
    report = act.analyze(models.gpt2(), list(args), kwargs=kwargs, mode="real")
    real = memtracker_step(models.gpt2(), args, kwargs)
    assert report.mode == "real"
    assert report.summary.peak_bytes == real.peak_bytes


def test_tied_weights_count_once() -> None:
    model = models.gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    args, kwargs = models.token_inputs(2, 16, 500)
    report = act.analyze(model, list(args), kwargs=kwargs)
    unique = {id(p): p.numel() * p.element_size() for p in model.parameters()}
    assert report.summary.parameter_bytes == sum(unique.values())
    # the head's weight is the embedding's: counting it twice would add vocab x width x 4 bytes
    assert report.summary.parameter_bytes < sum(p.numel() * 4
                                                for _, p in model.named_parameters(remove_duplicate=False))


def test_views_and_in_place_ops_cost_nothing() -> None:
    import torch

    class Views(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            y = y.view(-1).view(x.shape).transpose(0, 1).transpose(0, 1)  # views: same storage
            y.mul_(2).add_(1)  # in place: same storage
            return y

    class Copies(Views):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            return (y.transpose(0, 1).contiguous() * 2 + 1).transpose(0, 1)

    def forward_storages(model: torch.nn.Module) -> list[int]:
        trace = act.analyze(model, [x]).trace
        return [s.nbytes for s in trace.storages if s.phase.value == "forward"]

    x = torch.randn(64, 256)
    assert forward_storages(Views()) == [64 * 256 * 4]  # the linear's output, nothing else
    assert forward_storages(Copies()) == [64 * 256 * 4] * 4
    assert act.analyze(Views(), [x]).summary.peak_bytes == memtracker_step(Views(), (x,), {}).peak_bytes


def test_a_graph_branch_nothing_needs_is_freed_as_in_the_real_step() -> None:
    """Tracing saved tensors must not keep what the step frees: a hook that returned the tensor itself would
    tie a saved output to its own node, and a detached branch's graph would live on."""
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    real = memtracker_step(edge_models.DetachedStatistic(), (x,), {})
    for mode in ("fake", "real"):
        # such a cycle runs through autograd's C++ nodes: the garbage collector never frees it
        predicted = act.analyze(edge_models.DetachedStatistic(), [x], mode=mode).summary.peak_bytes
        assert predicted == real.peak_bytes, (mode, predicted, real.peak_bytes)
