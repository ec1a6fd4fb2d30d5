"""`--fit batch --lora 16` and `--fit batch --quantize nf4 --lora 16`, checked as `--fit` is checked (issue 38):
at the answer s the step fits the budget and at s + 1 it does not, predicted and on a real peft (and bitsandbytes)
step by the CPU allocator's events; with a plan, following the answer's hint (`--budget` at that batch) finds the
plan it names at s and none at s + 1, and the plan applied to the real model fits at s and not at s + 1."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app
from tests.activations import lora_models, models

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

BUDGET, BUDGET_BYTES = "4MiB", 4 * 2**20


def inputs(batch: int) -> list[str]:
    return ["--input", f"int64[{batch},32]<500", "--input", f"labels=int64[{batch},32]<500"]


def activations(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["activations", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("quantize", [None, "nf4"])
def test_the_batch_fit_with_lora_holds_at_s_and_not_at_s_plus_1(quantize: str | None,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    directory = lora_models.saved("llama", tmp_path_factory.mktemp("lora-fit"))
    adapt = ["--lora", "16", *(["--quantize", quantize] if quantize else [])]
    code, out, err = activations([str(directory), *inputs(4), *adapt, "--fit", "batch", "--budget", BUDGET,
                                  "--format", "json"])
    assert code == 0, err
    answer = json.loads(out)["fit"]
    plain, planned = answer["without_plan"], answer["with_plan"]
    assert plain["size"] >= 2 and planned["size"] > plain["size"], answer
    assert "--budget at that batch finds it" in activations([str(directory), *inputs(4), *adapt, "--fit", "batch",
                                                             "--budget", BUDGET])[1]

    def real(batch: int, plan: dict[str, Any] | None = None) -> int:
        base = lora_models.quantized_from(directory, quantize) if quantize else models.llama()
        return lora_models.real_peak(lora_models.with_lora(base, r=16), batch=batch, plan=plan)

    def predicted(batch: int) -> int:
        code, out, err = activations([str(directory), *inputs(batch), *adapt, "--format", "json"])
        assert code == 0, err
        return int(json.loads(out)["summary"]["peak_bytes"])

    size = plain["size"]
    assert predicted(size) <= BUDGET_BYTES < predicted(size + 1)
    at, over = real(size), real(size + 1)
    assert at <= BUDGET_BYTES < over, (size, at, over)

    # The hint, followed: --budget at the planned batch finds the answer's plan, one more finds none.
    size, plan = planned["size"], planned["plan"]
    code, out, err = activations([str(directory), *inputs(size), *adapt, "--budget", BUDGET, "--format", "json"])
    assert code == 0, err
    found = json.loads(out)["plan"]
    assert ([found[k] for k in ("checkpoint", "sequential", "segments")]
            == [plan[k] for k in ("checkpoint", "sequential", "segments")])
    assert found["checkpoint"] and found["compared_bytes"] <= BUDGET_BYTES
    code, _, err = activations([str(directory), *inputs(size + 1), *adapt, "--budget", BUDGET])
    assert code == 1 and "no checkpoint plan found fits" in err, err  # exit 1: no plan the search traced fits
    at, over = real(size, plan), real(size + 1, plan)
    assert at <= BUDGET_BYTES < over, (size, at, over)
