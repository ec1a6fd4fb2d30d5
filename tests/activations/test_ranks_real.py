"""Predictions checked against real ranks: two gloo processes on this CPU, each measured by FSDPMemTracker.

The real ranks run the step as torch's own FSDPMemTracker tests do (real_ranks.py),
sharded by hand with the FSDP2 recipe, or by the code a report prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.parallel import ShardingOptions
from tests.activations import real_ranks
from tests.activations.sharded_models import BATCH_SPECS

UNEVEN = "tests.activations.sharded_models:llama_style"
EVEN = "tests.activations.sharded_models:llama_style_even"
BATCH = "tests.activations.sharded_models:token_batch"


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two real ranks of the uneven model, sharded by hand: each block, then the root."""
    return real_ranks.run_ranks(real_ranks.measure_step, 2, tmp_path_factory.mktemp("recipe"), UNEVEN, None, BATCH)


def within_2_percent(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= 0.02 * measured


def test_the_prediction_of_each_rank_is_the_real_ranks_peak(recipe_run: list[dict[str, Any]]) -> None:
    measured = real_ranks.peaks(recipe_run)
    report = analyze_ranks(UNEVEN, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2))
    predicted = {r.rank: r.peak_bytes for r in report.ranks}
    # The MLP width is odd, so the two ranks hold different shards and both are traced.
    assert set(predicted) == {0, 1} and measured[0] != measured[1]
    for rank, peak in measured.items():
        assert within_2_percent(predicted[rank], peak), (rank, predicted[rank], peak)
    assert report.summary.peak_bytes == max(predicted.values())


def test_tensor_parallel_as_the_code_prints_it_is_predicted(tmp_path: Path) -> None:
    report = analyze_ranks(EVEN, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2, tp=2))
    real = real_ranks.run_ranks(real_ranks.measure_step, 2, tmp_path, EVEN, report.sharding.code(), BATCH)
    (predicted,) = report.ranks
    assert predicted.same_layout == ((0, 1),)
    for rank, peak in real_ranks.peaks(real).items():
        assert within_2_percent(predicted.peak_bytes, peak), (rank, predicted.peak_bytes, peak)


def test_a_plan_applied_for_real_holds_and_trains_the_same(recipe_run: list[dict[str, Any]], tmp_path: Path) -> None:
    baseline = max(real_ranks.peaks(recipe_run).values())
    budget = int(baseline * 0.8)
    report = analyze_ranks(UNEVEN, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2), budget=budget)
    plan = report.plan
    assert plan is not None and plan.sharding.checkpoint
    real = real_ranks.run_ranks(real_ranks.measure_step, 2, tmp_path, UNEVEN, plan.sharding.code(), BATCH)
    predicted = {r.rank: r.peak_bytes for r in plan.ranks}
    for result in real:
        assert result["peak_bytes"] <= budget
        assert within_2_percent(predicted[result["rank"]], result["peak_bytes"])
        # Checkpointing reruns the same forward: both steps' losses are bitwise those of the run without it.
        assert result["losses"] == recipe_run[result["rank"]]["losses"]
