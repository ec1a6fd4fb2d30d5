"""Building any model: an `__init__` that reads values builds, ties survive, and a build that cannot be done
without values says which op needed one and on which line, with a hint that works when followed."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.model.input_specs import parse_input_spec
from memlayout.cli.app import app
from memlayout.errors import UsageError
from tests.activations import edge_models
from tests.activations.measure import allocator_peak_step, memtracker_step

SPEC = "tests.activations.edge_models:"
CASES: dict[str, tuple[Callable[[], torch.nn.Module], list[str]]] = {
    "vit": (edge_models.vit, ["float32[4,3,32,32]"]),
    "tied_lm": (edge_models.tied_lm, ["int64[4,24]<300"]),
    "shared_buffer": (edge_models.shared_buffer, ["float32[32,64]"]),
}


def real_inputs(specs: list[str]) -> tuple[Any, ...]:
    generator = torch.Generator().manual_seed(0)
    made = []
    for spec in specs:
        made.append(parse_input_spec(spec).make_tensor("cpu", generator))
    return tuple(made)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_factory_that_reads_values_builds_and_is_predicted_as_measured(name: str) -> None:
    build, specs = CASES[name]
    with torch._subclasses.fake_tensor.FakeTensorMode(), pytest.raises(Exception) as on_fake:
        build()
    assert "DataDependentOutputException" in type(on_fake.value).__name__  # the case: fake tensors alone fail

    report = act.analyze(SPEC + name, specs)
    assert report.mode == "fake"
    assert any("meta parameters" in note and "_local_scalar_dense" in note for note in report.notes)
    args = real_inputs(specs)
    # The allocator's events, which see a kernel's scratch: the tied head's weight gradient is a matmul with the
    # loss's gradient, an expanded tensor (stride 0) that the kernel first copies, 76,036 B that a storage
    # counter (MemTracker) does not see.
    real = allocator_peak_step(build(), args, {})
    assert abs(report.summary.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes, (
        report.summary.peak_bytes, real.peak_bytes)
    unique = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in build().parameters()}
    assert report.summary.parameter_bytes == sum(unique.values())


def test_a_tied_weight_stays_one_parameter_and_one_storage() -> None:
    report = act.analyze(SPEC + "tied_lm", ["int64[2,8]<300"])
    model = edge_models.tied_lm()
    assert model.head.weight is model.embed.weight
    untied = sum(p.numel() * 4 for _, p in model.named_parameters(remove_duplicate=False))
    assert report.summary.parameter_bytes == untied - 300 * 48 * 4


def test_views_of_one_buffer_stay_one_storage() -> None:
    report = act.analyze(SPEC + "shared_buffer", ["float32[8,64]"])
    assert report.summary.parameter_bytes == 2 * 64 * 64 * 4
    parameters = [s for s in report.trace.storages if s.kind.value == "parameter"]
    assert len(parameters) == 1


def _line_of(text: str, obj: Any) -> int:
    source, start = inspect.getsourcelines(obj)
    return start + next(i for i, line in enumerate(source) if text in line)


def test_a_value_read_from_a_parameter_names_the_op_and_the_line() -> None:
    with pytest.raises(UsageError) as caught:
        act.analyze(SPEC + "reads_its_weights", ["float32[4,16]"])
    message = caught.value.one_line()
    line = _line_of(".item()", edge_models.ReadsItsWeights.__init__)
    assert f"edge_models.py:{line} in __init__" in message
    assert "self.linear.weight.abs().max().item()" in message
    assert "item()" in message and "parameter" in message
    assert "point the spec at a factory" not in message  # the factory takes no arguments: not the user's fault


def test_the_hint_for_a_value_read_works_when_followed() -> None:
    command = ["activations", SPEC + "reads_its_weights", "--input", "float32[4,16]", "--format", "json"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2 and result.stdout == ""
    assert "pass --real" in result.stderr and "memlayout.activations.analyze(model" in result.stderr
    # 1. --real
    result = CliRunner().invoke(app, [*command, "--real"])
    assert result.exit_code == 0, result.stderr
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    truth = memtracker_step(edge_models.reads_its_weights(), (x,), {}).peak_bytes
    assert json.loads(result.stdout)["summary"]["peak_bytes"] == truth
    # 2. build it yourself and hand it over: it is copied onto fake tensors
    model = edge_models.reads_its_weights()
    report = act.analyze(model, [x])
    assert report.mode == "fake" and report.summary.peak_bytes == truth


def test_a_factory_that_fails_for_its_own_reasons_is_named_with_its_line() -> None:
    result = CliRunner().invoke(app, ["activations", SPEC + "raises", "--input", "float32[2]"])
    assert result.exit_code == 2 and result.stdout == ""
    line = _line_of("raise ValueError", edge_models.raises)
    assert result.stderr.startswith(f"memlayout: error: calling {SPEC}raises raised ValueError: no such layer size: 7")
    assert f"edge_models.py:{line} in raises" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "unexpected" not in result.stderr


def test_a_factory_that_needs_arguments_says_so() -> None:
    result = CliRunner().invoke(app, ["activations", "tests.activations.models:token_inputs", "--input", "float32[2]"])
    assert result.exit_code == 2
    assert "needs arguments: batch, length, vocab" in result.stderr
    assert "point the spec at a factory that builds the model with no arguments" in result.stderr


def test_a_model_instance_named_by_a_spec_is_copied_not_changed() -> None:
    weight = edge_models.INSTANCE[0].weight
    report = act.analyze(SPEC + "INSTANCE", ["float32[4,16]"])
    assert report.mode == "fake" and report.summary.parameter_bytes == (16 * 16 + 16) * 4
    assert edge_models.INSTANCE[0].weight is weight
    assert not isinstance(weight, torch._subclasses.fake_tensor.FakeTensor)
    assert weight.grad is None


def test_a_step_that_reads_a_value_of_its_weights_names_it_and_its_hint_works() -> None:
    command = ["activations", SPEC + "gates_on_its_weights", "--input", "float32[4,16]", "--format", "json"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2 and result.stdout == ""
    line = _line_of("if self.linear.weight.mean() > 0", edge_models.GatesOnItsWeights.forward)
    assert result.stderr.startswith("memlayout: error: the step reads a value that fake tensors do not have")
    assert f"edge_models.py:{line} in forward" in result.stderr and "(pass --real" in result.stderr
    result = CliRunner().invoke(app, [*command, "--real"])  # follow it
    assert result.exit_code == 0, result.stderr
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    assert json.loads(result.stdout)["summary"]["peak_bytes"] == memtracker_step(
        edge_models.gates_on_its_weights(), (x,), {}).peak_bytes
