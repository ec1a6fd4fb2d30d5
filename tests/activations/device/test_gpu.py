"""CUDA: the prediction against torch.cuda.max_memory_allocated, and --real on CUDA (issue 13's 5% goal)."""

from __future__ import annotations

import pytest
import torch

import memlayout.activations as act
from tests.activations import models

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def real_cuda_peak(model: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> int:
    """A steady-state step with AdamW (torch's default foreach kernels on CUDA), as memlayout's default traces it."""
    from memlayout.activations.step.run import AfterBackward, run_step

    model = model.cuda()
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    optimizer = torch.optim.AdamW(model.parameters())
    run_step(model, args, kwargs, after=AfterBackward(optimizer))
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() - sum(
        v.untyped_storage().nbytes() for state in optimizer.state.values() for v in state.values()
        if isinstance(v, torch.Tensor) and v.is_cuda
    )
    run_step(model, args, kwargs, after=AfterBackward(optimizer))
    torch.cuda.synchronize()
    # what the model and inputs already held counts, as memlayout counts them
    return torch.cuda.max_memory_allocated() - base + sum(
        t.untyped_storage().nbytes() for t in {id(t): t for t in [*model.parameters(), *args]}.values()
        if isinstance(t, torch.Tensor)
    )


@pytest.mark.parametrize("case", ["gpt2", "flat-cnn"])
def test_fake_cuda_prediction_within_5_percent_of_max_memory_allocated(case: str) -> None:
    build, (args, kwargs) = {
        "gpt2": (models.gpt2, models.token_inputs(8, 128, 500)),
        "flat-cnn": (models.flat_cnn, models.image_inputs(16, 64)),
    }[case]
    report = act.analyze(build(), list(args), kwargs=kwargs, device="cuda")
    truth = real_cuda_peak(build(), args, kwargs)
    assert report.summary.allocator_peak_bytes is not None
    assert abs(report.summary.allocator_peak_bytes - truth) <= 0.05 * truth
    real = act.analyze(build(), list(args), kwargs=kwargs, device="cuda", mode="real")
    assert abs(real.summary.peak_bytes - report.summary.peak_bytes) <= 0.05 * report.summary.peak_bytes
