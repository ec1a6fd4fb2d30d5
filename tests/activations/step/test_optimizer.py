"""The optimizer's state and step in the prediction, against MemTracker on a real steady-state step."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.cli.app import app
from tests.activations import models
from tests.activations.measure import allocator_peak_step, memtracker_step, user_optimizer

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
OPTIMIZERS = ("adamw", "adam", "sgd", "none")


class Wide(nn.Module):
    """One large weight and small activations: the optimizer's update is where memory peaks."""

    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class WithUnused(nn.Module):
    """A parameter that never gets a gradient: torch's optimizers keep no state for it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(64, 64)
        self.unused = nn.Linear(64, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def real_state_bytes(model: nn.Module, x: torch.Tensor, name: str) -> int:
    """What torch's optimizer keeps after a real step, each storage once."""
    optimizer = user_optimizer(model, name)
    model(x).sum().backward()
    if optimizer is None:
        return 0
    optimizer.step()
    storages = {
        id(v.untyped_storage()): v.untyped_storage().nbytes()
        for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
    }
    return sum(storages.values())


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_optimizer_is_predicted_as_memtracker_measures_it(optimizer: str) -> None:
    args, kwargs = models.token_inputs(4, 32, 500)
    report = act.analyze(models.gpt2(), list(args), kwargs=kwargs, optimizer=optimizer)
    real = memtracker_step(models.gpt2(), args, kwargs, optimizer=optimizer)
    assert report.optimizer == optimizer
    assert abs(report.summary.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes, (
        report.summary.peak_bytes, real.peak_bytes)


def test_optimizer_state_is_what_torch_keeps() -> None:
    x = torch.randn(8, 1024)
    found = {name: act.analyze(Wide(), [x], optimizer=name).summary.optimizer_bytes for name in OPTIMIZERS}
    assert found == {name: real_state_bytes(Wide(), x, name) for name in OPTIMIZERS}
    parameters = sum(p.numel() * 4 for p in Wide().parameters())
    assert found["none"] == 0
    assert found["sgd"] == parameters  # one momentum buffer
    assert found["adamw"] > 2 * parameters  # two moments, and a step count per parameter


def test_the_optimizers_own_temporaries_can_make_the_peak() -> None:
    x = torch.randn(8, 1024)
    report = act.analyze(Wide(), [x])
    real = memtracker_step(Wide(), (x,), {})
    s = report.summary
    assert s.peak_at.phase == "optimizer"
    assert s.peak_at.module is None
    # the update allocates on top of the parameters, their gradients and the state (AdamW's sqrt, then its division)
    assert s.peak_bytes > s.parameter_bytes + s.gradient_bytes + s.optimizer_bytes + s.input_bytes
    assert abs(s.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes, (s.peak_bytes, real.peak_bytes)
    without = act.analyze(Wide(), [x], optimizer="none").summary
    assert without.peak_at.phase == "backward"
    assert s.peak_bytes - without.peak_bytes > s.optimizer_bytes


def test_a_parameter_that_gets_no_gradient_gets_no_state() -> None:
    x = torch.randn(16, 64)
    report = act.analyze(WithUnused(), [x])
    used = sum(p.numel() * 4 for p in WithUnused().used.parameters())
    assert 2 * used <= report.summary.optimizer_bytes < 2 * used + 64  # plus a 4-byte step count per parameter
    assert report.summary.optimizer_bytes == real_state_bytes(WithUnused(), x, "adamw")
    real = memtracker_step(WithUnused(), (x,), {})
    assert abs(report.summary.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes


def test_real_mode_steps_the_optimizer_too() -> None:
    x = torch.randn(8, 1024)
    fake = act.analyze(Wide(), [x]).summary
    real = act.analyze(Wide(), [x], mode="real").summary
    assert real.peak_bytes == fake.peak_bytes and real.optimizer_bytes == fake.optimizer_bytes


def test_the_caller_s_model_is_not_stepped() -> None:
    model = Wide()
    before = model.linear.weight.detach().clone()
    act.analyze(model, [torch.randn(8, 1024)], mode="real")
    assert torch.equal(model.linear.weight, before)
    assert model.linear.weight.grad is None


GPT2 = ["activations", "tests.activations.models:gpt2", "--input", "int64[2,32]<500", "--input",
        "labels=int64[2,32]<500"]


def test_cli_optimizer_option_and_its_json() -> None:
    result = CliRunner().invoke(app, [*GPT2, "--optimizer", "sgd", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["optimizer"] == "sgd"
    assert report["summary"]["optimizer_bytes"] == report["summary"]["parameter_bytes"]
    default = json.loads(CliRunner().invoke(app, [*GPT2, "--format", "json"]).stdout)
    assert default["optimizer"] == "adamw"
    assert default["summary"]["at_peak"]["optimizer_state"] > 0


def test_cli_help_states_the_default_and_an_unknown_optimizer_is_one_line() -> None:
    help_text = " ".join(CliRunner().invoke(app, ["activations", "--help"]).stdout.split())
    assert "adamw (the default" in help_text
    result = CliRunner().invoke(app, [*GPT2, "--optimizer", "lion"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("memlayout: error: unknown optimizer 'lion'")
    assert len(result.stderr.strip().splitlines()) == 1


def test_frozen_parameters_get_no_gradient_and_no_state() -> None:
    from tests.activations import edge_models

    ids = torch.randint(0, 500, (4, 32), generator=torch.Generator().manual_seed(0))
    report = act.analyze(edge_models.frozen_embedding(), [ids])
    # The allocator's events, which see a kernel's scratch: the summed loss's gradient reaches the last matmul
    # expanded (stride 0), and the kernel copies it first, which a storage counter (MemTracker) does not see.
    real = allocator_peak_step(edge_models.frozen_embedding(), (ids,), {})
    assert report.summary.peak_bytes == real.peak_bytes, (report.summary.peak_bytes, real.peak_bytes)
    model = edge_models.frozen_embedding()
    trainable = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    assert report.summary.gradient_bytes == trainable
    assert 2 * trainable <= report.summary.optimizer_bytes < 2 * trainable + 64
