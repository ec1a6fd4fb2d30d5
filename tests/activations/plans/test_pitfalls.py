"""Pitfalls are flagged where they apply, from what the trace saw each module do."""

from __future__ import annotations

import torch
from torch import nn

import memlayout.activations as act
from tests.activations import models

GLOBAL_SCALE = torch.full((8,), 2.0)


class ReadsGlobal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)) * GLOBAL_SCALE


class MovesDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)
        elsewhere = hidden.to("meta")  # the only other device a CPU-only torch has
        return torch.tanh(hidden) + torch.zeros_like(elsewhere, device=hidden.device)


class Net(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.block(x))))


def modules(report: act.ActivationReport) -> dict[str, object]:
    return {m.path: m for m in report.modules}


def test_reading_state_outside_inputs_parameters_and_buffers_is_flagged() -> None:
    report = act.analyze(Net(ReadsGlobal()), ["float32[16,8]"])
    found = modules(report)
    assert found["block"].reads_outside_state  # type: ignore[attr-defined]
    assert not found["head"].reads_outside_state  # type: ignore[attr-defined]
    plan = act.analyze(Net(ReadsGlobal()), ["float32[16,8]"]).summary
    assert plan.peak_bytes > 0
    from memlayout.activations.plans.pitfalls import pitfalls
    from memlayout.activations.plans.plan import Plan

    text = " ".join(pitfalls(Plan(checkpoint=("block",)), report.modules, Net(ReadsGlobal())))
    assert "block: reads tensors that are not its inputs" in text
    assert "silently wrong" in text


def test_batch_norm_updating_running_statistics_is_flagged() -> None:
    report = act.analyze(Net(nn.Linear(8, 8)), ["float32[16,8]"])
    found = modules(report)
    assert found["norm"].mutates_buffers  # type: ignore[attr-defined]
    assert not found["block"].mutates_buffers  # type: ignore[attr-defined]
    from memlayout.activations.plans.pitfalls import pitfalls
    from memlayout.activations.plans.plan import Plan

    assert any("a second time" in p for p in pitfalls(Plan(checkpoint=("norm",)), report.modules, None))
    assert not any("a second time" in p for p in pitfalls(Plan(checkpoint=("block",)), report.modules, None))


def test_dropout_is_randomness_and_its_cost_is_explained() -> None:
    args, kwargs = models.token_inputs(2, 16, 500)
    report = act.analyze(models.gpt2(), list(args), kwargs=kwargs)
    found = modules(report)
    assert found["transformer.drop"].uses_randomness  # type: ignore[attr-defined]
    assert not found["transformer.ln_f"].uses_randomness  # type: ignore[attr-defined]
    assert found["transformer.h.0"].uses_randomness  # type: ignore[attr-defined]


def test_moving_tensors_to_another_device_is_flagged() -> None:
    report = act.analyze(Net(MovesDevice()), ["float32[16,8]"], mode="real")
    assert modules(report)["block"].moves_device  # type: ignore[attr-defined]
    assert not modules(report)["head"].moves_device  # type: ignore[attr-defined]


def test_the_plan_lists_the_pitfalls_of_its_own_modules() -> None:
    args, kwargs = models.token_inputs(4, 64, 500)
    peak = act.analyze(models.gpt2(), list(args), kwargs=kwargs).summary.peak_bytes
    plan = act.analyze(models.gpt2(), list(args), kwargs=kwargs, budget=int(peak * 0.7)).plan
    assert plan is not None
    text = "\n".join(plan.pitfalls)
    assert "use_reentrant=False" in text and "torch.autograd.grad" in text
    assert "use_cache=False" in text
    random = [p for p in plan.plan.checkpoint if "attn" in p or p.endswith(tuple("0123456789"))]
    if random:
        assert "uses randomness" in text


def test_attention_without_dropout_is_not_randomness() -> None:
    args, kwargs = models.token_inputs(2, 16, 500)
    found = modules(act.analyze(models.llama(), list(args), kwargs=kwargs))
    assert not any(m.uses_randomness for m in found.values())  # type: ignore[attr-defined]
    no_dropout = modules(act.analyze(models.gpt2(dropout=0.0), list(args), kwargs=kwargs))
    assert not any(m.uses_randomness for m in no_dropout.values())  # type: ignore[attr-defined]
