"""`--sweep`: each size's row is what one prediction at that size reports, to the byte, traced or evaluated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.fit.size_search import fit
from memlayout.activations.fit.sweep import EVALUATED, FAILED, TRACED, SweepReport
from memlayout.activations.report.json_report import ActivationsJson
from memlayout.activations.report.sweep import render_sweep_table
from memlayout.cli.app import app
from tests.activations import models
from tests.activations.fit.test_fit import real_peak

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "memlayout" / "activations" / "schema_v1.json").read_text())
LLAMA = "tests.activations.models:llama"
GPT2 = "tests.activations.models:gpt2"
MIB = 2**20


def inputs(batch: int, length: int) -> tuple[str, str]:
    return f"int64[{batch},{length}]<500", f"labels=int64[{batch},{length}]<500"


def sweep(target: Any, given: tuple[str, ...], **settings: Any) -> SweepReport:
    report = act.predict(act.StepRequest(target, input=given, **settings))
    assert isinstance(report, SweepReport)
    return report


def figures(summary: Any) -> tuple[int | None, ...]:
    return summary.peak_bytes, summary.allocator_peak_bytes, summary.reserved_peak_bytes


@pytest.fixture(scope="module")
def batch_sweep() -> SweepReport:
    return sweep(LLAMA, inputs(2, 16), sweep="batch=1:7")


def test_every_size_of_a_batch_sweep_is_one_prediction_at_that_size(batch_sweep: SweepReport) -> None:
    assert [row.size for row in batch_sweep.rows] == list(range(1, 8))
    assert len(batch_sweep.evaluated_sizes) >= 2, batch_sweep.how  # the laws did their work...
    # ...and each row evaluated is the prediction there, as the smallest traced one is (a trace of the same model
    # at another size, as --fit's probes are).
    for row in [batch_sweep.rows[0], *(row for row in batch_sweep.rows if row.source == EVALUATED)]:
        one = act.analyze(LLAMA, list(inputs(row.size, 16)))
        assert (row.peak_bytes, row.allocator_peak_bytes, row.reserved_peak_bytes) == figures(one.summary), row
        assert row.compared_bytes == one.summary.peak_bytes and row.fits is None  # the CPU, no budget
    assert "evaluated at" in batch_sweep.how and "traced at batch" in batch_sweep.how


def test_a_sequence_sweep_evaluates_attentions_square_from_four_traces() -> None:
    # GPT-2's eager attention keeps seq x seq scores: a parabola, which a fourth traced size checks.
    report = sweep(GPT2, inputs(2, 16), sweep="seq=16:112:16")
    assert len(report.traced_sizes) == 4 and report.evaluated_sizes, report.how
    assert "modulo 16" in report.how
    for row in report.rows:
        if row.source == EVALUATED:
            one = act.analyze(GPT2, list(inputs(2, row.size)))
            assert row.peak_bytes == one.summary.peak_bytes, row


def test_with_a_budget_each_size_that_does_not_fit_has_the_plan_budget_finds_there() -> None:
    budget = 5 * MIB
    report = sweep(GPT2, inputs(2, 32), sweep="batch=3,5,7", budget="5MiB")
    assert report.planned and report.budget_bytes == budget
    for row in report.rows:
        one = act.analyze(GPT2, list(inputs(row.size, 32)), budget=budget)
        assert one.plan is not None
        if row.fits:
            assert row.plan is None and one.plan.plan.empty
            continue
        assert row.plan is not None and row.plan.found and row.plan.result is not None
        assert row.plan.result.plan == one.plan.plan
        assert row.plan.result.peak_bytes == one.plan.peak_bytes <= budget
    assert [row.fits for row in report.rows] == [True, False, False]


def test_each_rows_decision_is_a_real_steps_at_that_size_with_and_without_its_plan() -> None:
    # The decision, not only the number: at 11 MiB, batch 5 fits and 6 does not, and 6 is evaluated, not traced.
    budget = 11 * MIB
    report = sweep(GPT2, inputs(4, 64), sweep="batch=4:7", budget="11MiB")
    assert report.evaluated_sizes, report.how
    assert [row.fits for row in report.rows] == [True, True, False, False]
    for row in report.rows:
        real = real_peak(models.gpt2, row.size, 64)
        assert row.peak_bytes == real and row.fits == (real <= budget), (row, real)
        if row.fits:
            continue
        assert row.plan is not None and row.plan.found and row.plan.result is not None
        planned = real_peak(models.gpt2, row.size, 64, row.plan.result.plan)
        assert planned <= budget < real, (row, planned)


def test_with_fit_its_answers_are_fits_own_on_the_same_model() -> None:
    report = sweep(GPT2, inputs(2, 32), sweep="batch=2,4,6", budget="5MiB", fit="batch")
    alone = fit(models.gpt2(), list(inputs(2, 32)), budget=5 * MIB)
    assert report.fit is not None and report.fit.with_plan is not None and alone.with_plan is not None
    assert (report.fit.without_plan.size, report.fit.with_plan.size) == (alone.without_plan.size,
                                                                         alone.with_plan.size)
    # The sizes the sweep traced are read by fit's probes, not traced again.
    shared = {probe.size for probe in report.fit.probes if not probe.with_plan} & set(report.traced_sizes)
    assert shared


def test_a_sequence_past_the_models_positions_is_a_row_that_says_so_untraced() -> None:
    # Fake tensors do not check an index against the position table, so gpt2()'s 128 positions bound the sweep.
    report = sweep(GPT2, inputs(2, 16), sweep="seq=64,128,192")
    past = report.rows[-1]
    assert past.source == FAILED and past.failure and "max_position_embeddings (128)" in past.failure
    assert report.traced_sizes == (64, 128)
    assert "traced at seq 64, 128;" in report.how + ";" and "192" not in report.how


class Chunked(nn.Module):
    """Reads its tokens in chunks of 4: a sequence that is no multiple of 4 fails."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(500, 16)
        self.head = nn.Linear(64, 500)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        return self.head(hidden.reshape(ids.shape[0], ids.shape[1] // 4, 64))


def test_a_size_the_traced_ones_share_no_class_with_is_traced_and_fails_there() -> None:
    # 8, 12, 16 and 20 are multiples of 4 (their differences' gcd): 14 is not in their class, so it is traced, not
    # evaluated, and the step fails there as one prediction at 14 would.
    report = sweep(Chunked(), ("int64[2,8]<500",), sweep="seq=8,12,14,16,20")
    failed = {row.size: row for row in report.rows}[14]
    assert failed.source == FAILED and failed.peak_bytes is None and failed.failure and "reshape" in failed.failure
    assert {row.source for row in report.rows if row.size != 14} <= {TRACED, EVALUATED}
    assert "failed" in render_sweep_table(report)


def test_the_report_is_schema_1_with_the_rows_and_a_table(batch_sweep: SweepReport) -> None:
    data = json.loads(ActivationsJson().render(batch_sweep))
    jsonschema.validate(data, SCHEMA)
    assert [row["size"] for row in data["sweep"]] == list(range(1, 8))
    assert {row["source"] for row in data["sweep"]} == {TRACED, EVALUATED}
    assert data["sweep_of"]["evaluated_sizes"] == list(batch_sweep.evaluated_sizes)
    assert data["summary"]["peak_bytes"] == batch_sweep.rows[0].peak_bytes  # the step at the smallest size
    table = render_sweep_table(batch_sweep)
    for row in batch_sweep.rows:
        assert any(line.split()[:1] == [str(row.size)] for line in table.splitlines())
    assert "evaluated" in table and "traced" in table


def test_the_command_writes_the_table_and_the_plot(tmp_path: Path) -> None:
    plot = tmp_path / "sweep.svg"
    result = CliRunner().invoke(app, ["activations", GPT2, "--input", inputs(2, 32)[0], "--input", inputs(2, 32)[1],
                                      "--sweep", "batch=1,2,4", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "memlayout activations --sweep batch" in result.stdout
    assert plot.read_text().lstrip().startswith("<?xml") and "<svg" in plot.read_text()


@pytest.mark.cuda_build
def test_on_a_gpu_every_size_is_one_prediction_there_with_the_reserved_peak_and_the_card() -> None:
    report = sweep(LLAMA, inputs(2, 16), sweep="batch=1:6", gpu="h100")
    assert report.evaluated_sizes and report.card_bytes is not None and report.budget_bytes == report.card_bytes
    for row in report.rows:
        one = act.analyze(LLAMA, list(inputs(row.size, 16)), gpu="h100")
        assert (row.peak_bytes, row.allocator_peak_bytes, row.reserved_peak_bytes) == figures(one.summary), row
        assert row.reserved_peak_bytes is not None and row.compared_bytes is not None
        assert row.compared_bytes > row.reserved_peak_bytes and row.fits
