"""Mixed precision and low-precision parameters (issue 27, section 1), against real CPU steps.

`--autocast bf16` traces forward and loss under torch.autocast("cpu", bfloat16), with
CPU's own op lists; `--dtype bf16` casts the model first, as pure-bf16 training
does. Each prediction is held to the CPU allocator's events of the same real step (profiler), as the
float32 predictions are (test_accuracy.py), within 2%.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.step.run import Autocast
from memlayout.cli.app import app
from tests.activations import models
from tests.activations.measure import allocator_peak_step, within_2_percent

CASES: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "gpt2": (lambda: models.gpt2(), lambda: models.token_inputs(4, 32, 500)),
    "llama": (lambda: models.llama(), lambda: models.token_inputs(4, 32, 500)),
    "flat-cnn": (lambda: models.flat_cnn(), lambda: models.image_inputs(4, 32)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_autocast_bf16_prediction_matches_the_real_cpu_step(case: str) -> None:
    build, make_inputs = CASES[case]
    args, kwargs = make_inputs()
    report = act.analyze(build(), list(args), kwargs=kwargs, autocast="bf16")
    real = allocator_peak_step(build(), args, kwargs, autocast=Autocast("cpu", "bf16"))
    assert report.autocast == "bf16"
    assert within_2_percent(report.summary.peak_bytes, real.peak_bytes), (report.summary.peak_bytes, real.peak_bytes)
    # autocast changed the step: the float32 prediction of the same model is another figure.
    plain = act.analyze(build(), list(args), kwargs=kwargs)
    assert plain.summary.peak_bytes != report.summary.peak_bytes


@pytest.mark.parametrize("case", sorted(CASES))
def test_pure_bf16_prediction_matches_the_real_cpu_step(case: str) -> None:
    build, make_inputs = CASES[case]
    args, kwargs = make_inputs()
    report = act.analyze(build(), list(args), kwargs=kwargs, dtype="bf16")
    def bf16(value: Any) -> Any:
        return value.to(torch.bfloat16) if value.is_floating_point() else value

    args, kwargs = tuple(bf16(a) for a in args), {k: bf16(v) for k, v in kwargs.items()}
    real = allocator_peak_step(build().to(torch.bfloat16), args, kwargs)
    assert report.dtype == "bf16"
    assert report.summary.parameter_bytes == sum(p.numel() * 2 for p in build().parameters())
    assert within_2_percent(report.summary.peak_bytes, real.peak_bytes), (report.summary.peak_bytes, real.peak_bytes)
    assert any("optimizer's state is bf16" in note for note in report.notes)


def test_the_cli_traces_autocast_and_says_so() -> None:
    result = CliRunner().invoke(app, [
        "activations", "tests.activations.models:flat_cnn", "--input", "float32[4,3,32,32]", "--autocast", "bf16",
        "--format", "json",
    ])
    assert result.exit_code == 0, result.output
    import json

    data = json.loads(result.stdout)
    assert data["autocast"] == "bf16" and data["dtype"] is None


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_optimizer_state_dtype_is_what_torchs_adamw_makes(dtype: str) -> None:
    """torch's AdamW makes exp_avg and exp_avg_sq `zeros_like` the parameter: a bf16 model's state is bf16
    (no float32 copy), and the report says the dtype the real optimizer's state has."""
    args, kwargs = models.token_inputs(4, 32, 500)
    report = act.analyze(models.llama(), list(args), kwargs=kwargs, dtype=dtype)
    model = models.llama().to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    real = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(*args, **kwargs).loss.backward()
    real.step()
    states = {str(v.dtype).removeprefix("torch.") for state in real.state.values() for k, v in state.items()
              if k in ("exp_avg", "exp_avg_sq")}
    assert states == {report.optimizer_state_dtype}
    assert report.optimizer_state_dtype == ("bfloat16" if dtype == "bf16" else "float32")


def test_the_json_and_the_table_say_the_optimizer_states_dtype() -> None:
    import json

    base = ["activations", "tests.activations.models:flat_cnn", "--input", "float32[4,3,32,32]", "--dtype", "bf16"]
    result = CliRunner().invoke(app, [*base, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["optimizer_state_dtype"] == "bfloat16"
    table = CliRunner().invoke(app, base)
    assert table.exit_code == 0, table.output
    assert " in bfloat16" in " ".join(table.stdout.split())


def test_autocast_and_dtype_with_world_size_are_traced_per_rank() -> None:
    import json

    base = ["activations", "tests.activations.sharded_models:llama_style_even", "--input",
            "input_ids=int64[2,128]<1000",
            "--input", "labels=int64[2,128]<1000", "--world-size", "2", "--fsdp", "--format", "json"]
    plain = json.loads(CliRunner().invoke(app, base).stdout)
    mixed = CliRunner().invoke(app, [*base, "--autocast", "bf16"])
    cast = CliRunner().invoke(app, [*base, "--dtype", "bf16", "--param-dtype", "float32"])
    assert mixed.exit_code == 0 and cast.exit_code == 0, (mixed.stderr, cast.stderr)
    mixed_data, cast_data = json.loads(mixed.stdout), json.loads(cast.stdout)
    assert mixed_data["autocast"] == "bf16" and mixed_data["optimizer_state_dtype"] == "float32"
    assert mixed_data["summary"]["peak_bytes"] != plain["summary"]["peak_bytes"]
    # --dtype casts before sharding: each rank's shard is half the float32 one, whatever FSDP2 gathers in.
    assert cast_data["dtype"] == "bf16" and cast_data["optimizer_state_dtype"] == "bfloat16"
    assert cast_data["ranks"][0]["shard_bytes"] * 2 == plain["ranks"][0]["shard_bytes"]
    assert "model.to(torch.bfloat16)" in cast_data["distributed"]["code"]


def test_an_unknown_precision_is_refused_in_one_line() -> None:
    result = CliRunner().invoke(app, [
        "activations", "tests.activations.models:flat_cnn", "--input", "float32[4,3,32,32]", "--dtype", "int8",
    ])
    assert result.exit_code == 2
    assert "unknown precision 'int8'" in result.stderr
