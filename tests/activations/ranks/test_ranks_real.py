"""Predictions checked against real ranks: two gloo processes on this CPU, each measured by FSDPMemTracker.

The real ranks run the step as torch's own FSDPMemTracker tests do (real_ranks.py),
sharded by hand with the FSDP2 recipe, or by the code a report prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.parallel import ShardingOptions
from tests.activations import real_ranks
from tests.activations.measure import within_2_percent
from tests.activations.sharded_models import BATCH_SPECS

UNEVEN = "tests.activations.sharded_models:llama_style"
EVEN = "tests.activations.sharded_models:llama_style_even"
BATCH = "tests.activations.sharded_models:token_batch"


def measure(folder: Path, predicted: Mapping[int, int], builder: str, code: str | None,
            *step: Any) -> list[dict[str, Any]]:
    """Two real ranks of `builder` (sharded by `code`, or by the recipe); a rank not within 2% of its `predicted`
    peak is measured again and the lower run kept (real_ranks.lower_of_two_runs)."""
    return real_ranks.lower_of_two_runs(
        lambda where: real_ranks.run_ranks(real_ranks.measure_step, 2, where, builder, code, BATCH, *step), folder,
        lambda rank: within_2_percent(predicted[rank["rank"]], rank["peak_bytes"]))


def both(peak: int) -> dict[int, int]:
    """One traced layout's peak, for both ranks."""
    return {0: peak, 1: peak}


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two real ranks of the uneven model, sharded by hand: each block, then the root."""
    report = analyze_ranks(UNEVEN, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2))
    return measure(tmp_path_factory.mktemp("recipe"), {r.rank: r.peak_bytes for r in report.ranks}, UNEVEN, None)


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
    (predicted,) = report.ranks
    real = measure(tmp_path, both(predicted.peak_bytes), EVEN, report.sharding.code())
    assert predicted.same_layout == ((0, 1),)
    for rank, peak in real_ranks.peaks(real).items():
        assert within_2_percent(predicted.peak_bytes, peak), (rank, predicted.peak_bytes, peak)


def test_a_plan_applied_for_real_holds_and_trains_the_same(recipe_run: list[dict[str, Any]], tmp_path: Path) -> None:
    baseline = max(real_ranks.peaks(recipe_run).values())
    budget = int(baseline * 0.8)
    report = analyze_ranks(UNEVEN, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2), budget=budget)
    plan = report.plan
    assert plan is not None and plan.sharding.checkpoint
    predicted = {r.rank: r.peak_bytes for r in plan.ranks}
    real = measure(tmp_path, predicted, UNEVEN, plan.sharding.code())
    for result in real:
        assert result["peak_bytes"] <= budget
        assert within_2_percent(predicted[result["rank"]], result["peak_bytes"])
        # Checkpointing reruns the same forward: both steps' losses are bitwise those of the run without it.
        assert result["losses"] == recipe_run[result["rank"]]["losses"]


# Mixed precision per rank (issue 27, section 1): transformers' Llama from a config, sharded by the FSDP2
# recipe by hand on two real gloo ranks, each measured by FSDPMemTracker.
LLAMA = "tests.activations.sharded_models:transformers_llama"


@pytest.mark.parametrize(("option", "real_kwargs"), [
    ({"autocast": "bf16"}, {"autocast": "bfloat16"}),
    ({"dtype": "bf16"}, {"cast": "bfloat16"}),
], ids=["autocast-bf16", "dtype-bf16"])
def test_each_ranks_mixed_precision_prediction_is_the_real_ranks_peak(
    option: dict[str, str], real_kwargs: dict[str, str], tmp_path: Path,
) -> None:
    report = analyze_ranks(LLAMA, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2), **option)
    # Every dimension splits evenly over 2 ranks: one traced layout stands for both.
    (traced,) = report.ranks
    real = measure(tmp_path, both(traced.peak_bytes), LLAMA, None, real_kwargs.get("autocast"), real_kwargs.get("cast"))
    float32 = analyze_ranks(LLAMA, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2))
    for result in real:
        assert within_2_percent(traced.peak_bytes, result["peak_bytes"]), (traced, result)
        # The optimizer's state is in the dtype torch's AdamW made it in on the real rank, and the report says so.
        assert result["optimizer_state_dtypes"] == [report.optimizer_state_dtype]
    # The option changed each rank's step: the float32 prediction of the same model is another figure.
    assert report.summary.peak_bytes != float32.summary.peak_bytes
    assert report.optimizer_state_dtype == ("bfloat16" if "dtype" in option else "float32")


def test_the_printed_code_casts_before_sharding_and_its_ranks_match(tmp_path: Path) -> None:
    report = analyze_ranks(LLAMA, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2), dtype="bf16",
                           autocast="bf16")
    code = report.sharding.code()
    assert code.index("model.to(torch.bfloat16)") < code.index("fully_shard(")
    real = measure(tmp_path, both(report.ranks[0].peak_bytes), LLAMA, code, "bfloat16")
    for result in real:
        assert within_2_percent(report.ranks[0].peak_bytes, result["peak_bytes"]), (report.ranks[0], result)
        assert result["optimizer_state_dtypes"] == ["bfloat16"]


def test_autocast_composes_with_fsdp2s_param_dtype_on_real_ranks(tmp_path: Path) -> None:
    options = ShardingOptions(world_size=2, param_dtype="bfloat16", reduce_dtype="float32")
    report = analyze_ranks(LLAMA, list(BATCH_SPECS), sharding=options, autocast="bf16")
    real = measure(tmp_path, both(report.ranks[0].peak_bytes), LLAMA, report.sharding.code(), "bfloat16")
    for result in real:
        assert within_2_percent(report.ranks[0].peak_bytes, result["peak_bytes"]), (report.ranks[0], result)
        # FSDP2 keeps the sharded parameters in float32 and gathers them in bf16: the state follows the shards.
        assert result["optimizer_state_dtypes"] == [report.optimizer_state_dtype] == ["float32"]


def test_torchtitans_recipe_on_real_ranks_is_each_ranks_peak(tmp_path: Path) -> None:
    # Op-level checkpointing with torchtitan's save list, the last block kept gathered, AdamW and clipping foreach:
    # the printed code applies the first two, the loop the others.
    report = analyze_ranks(LLAMA, list(BATCH_SPECS), world_size=2, fsdp=True, selective_ac="torchtitan",
                           reshard_after_forward=("torchtitan",), optimizer_impl="foreach", clip_grad_norm=1.0,
                           clip_grad_impl="foreach")
    (traced,) = report.ranks
    real = measure(tmp_path, both(traced.peak_bytes), LLAMA, report.sharding.code(), None, None, True, 1.0)
    for result in real:
        assert within_2_percent(traced.peak_bytes, result["peak_bytes"]), (traced, result)


@pytest.mark.parametrize("checkpointing", [
    {"ac_modules": ("model.layers.0", "model.layers.1")},
    {"selective_ac": "torchtitan"},
], ids=["whole-blocks", "torchtitan-save-list"])
def test_checkpointed_llama_on_real_ranks_is_each_ranks_peak_to_the_byte(checkpointing: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    # Checkpointing turns transformers' cache off, and with no cache Llama checks its position ids for packed
    # sequences: read as fake tensors it could not rule them out and built a [2, 1, 128, 128] boolean causal mask
    # the real ranks never make (32,768 B over each rank's peak, 5,456,668 against 5,423,900 for whole blocks).
    report = analyze_ranks(LLAMA, list(BATCH_SPECS), world_size=2, fsdp=True, **checkpointing)
    (traced,) = report.ranks
    real = real_ranks.lower_of_two_runs(
        lambda where: real_ranks.run_ranks(real_ranks.measure_step, 2, where, LLAMA, report.sharding.code(), BATCH),
        tmp_path, lambda rank: rank["peak_bytes"] == traced.peak_bytes)
    assert [result["peak_bytes"] for result in real] == [traced.peak_bytes] * 2, traced
