"""`--ddp` predictions checked against real DistributedDataParallel ranks: two gloo processes on this CPU.

The real ranks (real_ddp_ranks.py) build the model, wrap it in torch's DDP by hand (or by the
code a report prints) and train three AdamW steps; the third is judged by the CPU allocator's
own events. Each model runs with a bucket cap small enough to make several buckets, and with
gradient_as_bucket_view on and off, on a batch small enough that where the gradients live moves
the peak.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.ddp import DdpOptions
from memlayout.activations.ranks.parallel import ShardingOptions
from tests.activations import real_ddp_ranks, real_ranks
from tests.activations.measure import within_2_percent
from tests.activations.sharded_models import BATCH_SPECS, IMAGE_SPECS, SHORT_TOKEN_SPECS

TOKENS = "tests.activations.sharded_models:short_token_step_batch"
IMAGES = "tests.activations.sharded_models:image_batch"
CASES = {
    # name: (builder, the batch's builder, the same batch as --input specs, bucket_cap_mb)
    "llama": ("tests.activations.sharded_models:transformers_llama", TOKENS, SHORT_TOKEN_SPECS, 0.1),
    "gpt2": ("tests.activations.sharded_models:gpt2", TOKENS, SHORT_TOKEN_SPECS, 0.1),
    "bert": ("tests.activations.sharded_models:bert", TOKENS, SHORT_TOKEN_SPECS, 0.1),
    "cnn": ("tests.activations.sharded_models:wide_cnn", IMAGES, IMAGE_SPECS, 0.25),
}
PLANNED = ("tests.activations.sharded_models:transformers_llama", "tests.activations.sharded_models:token_step_batch",
           BATCH_SPECS, 0.1)
"""A Llama whose 2 x 128 tokens make activations most of the peak: a checkpoint plan has something to lower."""


def predict(name: str, view: bool) -> Any:
    builder, _, specs, cap = CASES.get(name, PLANNED)
    options = ShardingOptions(world_size=2, fsdp=False, ddp=DdpOptions(bucket_cap_mb=cap, gradient_as_bucket_view=view))
    return analyze_ranks(builder, list(specs), sharding=options)


def real(name: str, view: bool, folder: Path, code: str | None = None) -> list[dict[str, Any]]:
    builder, batch, _, cap = CASES.get(name, PLANNED)
    options = {"bucket_cap_mb": cap, "gradient_as_bucket_view": view}
    return real_ranks.run_ranks(real_ddp_ranks.measure_ddp_step, 2, folder, builder, batch, options, code)


@pytest.mark.parametrize("name", list(CASES))
def test_each_ranks_peak_is_the_real_ranks_with_and_without_gradients_as_bucket_views(name: str,
                                                                                      tmp_path: Path) -> None:
    measured = {}
    for view in (False, True):
        report = predict(name, view)
        peak = report.ranks[0].peak_bytes
        measured[view] = (report, real_ranks.lower_of_two_runs(
            lambda folder, view=view: real(name, view, folder), tmp_path / str(view),
            lambda rank, peak=peak: within_2_percent(peak, rank["peak_bytes"])))
    for report, ranks in measured.values():
        (predicted,) = report.ranks
        assert predicted.same_layout == ((0, 1),)
        for rank in ranks:
            assert within_2_percent(predicted.peak_bytes, rank["peak_bytes"]), (rank["rank"], predicted, rank)
        # The buckets reported are the ones DDP rebuilt, as its own logging data on each real rank gives them.
        layout = report.ddp
        assert layout is not None and len(layout.buckets) > 2, layout  # the small cap makes several
        for rank in ranks:
            assert [b.nbytes for b in layout.buckets] == rank["bucket_bytes"]
            assert [b.parameters for b in layout.buckets] == rank["bucket_parameters"]
        # They hold the trainable parameters' bytes, and are alive at the peak.
        assert layout.nbytes == predicted.shard_bytes == predicted.communication_bytes

    # Gradients as bucket views lower the peak by what they lower it on the real ranks.
    (beside, beside_ranks), (views, views_ranks) = measured[False], measured[True]
    predicted_saving = beside.ranks[0].peak_bytes - views.ranks[0].peak_bytes
    measured_saving = beside_ranks[0]["peak_bytes"] - views_ranks[0]["peak_bytes"]
    assert predicted_saving > 0.05 * beside.ranks[0].peak_bytes  # the option moves the peak: the case tests it
    assert abs(predicted_saving - measured_saving) <= 0.02 * beside_ranks[0]["peak_bytes"]
    # With views, no gradient of its own is alive at the peak.
    assert views.ranks[0].gradient_bytes == 0 < beside.ranks[0].gradient_bytes


def test_a_plan_applied_by_the_printed_code_holds_on_real_ranks(tmp_path: Path) -> None:
    baseline = predict("planned", True)
    budget = int(baseline.ranks[0].peak_bytes * 0.9)
    builder, _, specs, cap = PLANNED
    options = ShardingOptions(world_size=2, fsdp=False, ddp=DdpOptions(bucket_cap_mb=cap, gradient_as_bucket_view=True))
    report = analyze_ranks(builder, list(specs), sharding=options, budget=budget)
    plan = report.plan
    assert plan is not None and plan.sharding.checkpoint
    code = plan.sharding.code()
    assert "DistributedDataParallel(model, bucket_cap_mb=0.1, gradient_as_bucket_view=True)" in code
    plain = real("planned", True, tmp_path / "plain")
    planned = real("planned", True, tmp_path / "planned", code)
    for rank in planned:
        assert rank["peak_bytes"] <= budget < plain[rank["rank"]]["peak_bytes"]
        assert within_2_percent(plan.ranks[0].peak_bytes, rank["peak_bytes"]), (plan.ranks[0], rank)
        # Checkpointing reruns the same forward: the losses are bitwise those of the run without it.
        assert rank["losses"] == plain[rank["rank"]]["losses"]


FIT_TARGET = "tests.activations.sharded_models:llama_style"
FIT_SPECS = ["input_ids=int64[1,128]<1000", "labels=int64[1,128]<1000"]
FIT_BUDGET = 48 * 2**20


def test_the_batch_fit_finds_fits_real_ranks_and_its_budget_check_fails_one_more(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memlayout.activations.fit.size_search import fit
    from memlayout.cli.app import app

    options = ShardingOptions(world_size=2, fsdp=False, ddp=DdpOptions())
    report = fit(FIT_TARGET, FIT_SPECS, budget=FIT_BUDGET, sharding=options, with_plan=False)
    size = report.without_plan.size
    assert size > 1 and report.world_size == 2

    def real_at(batch: int) -> list[int]:
        ranks = real_ranks.run_ranks(real_ddp_ranks.measure_ddp_step, 2, tmp_path / str(batch), FIT_TARGET,
                                     "tests.activations.sharded_models:short_token_step_batch", {}, None,
                                     {"batch": batch, "length": 128})
        return [rank["peak_bytes"] for rank in ranks]

    # s runs under the budget on two real gloo ranks; s + 1 does not.
    assert max(real_at(size)) <= FIT_BUDGET < max(real_at(size + 1))

    def budget_check(batch: int) -> tuple[int, dict | None]:
        specs = [spec.replace("[1,", f"[{batch},") for spec in FIT_SPECS]
        args = [FIT_TARGET, *(a for spec in specs for a in ("--input", spec)), "--world-size", "2", "--ddp",
                "--budget", str(FIT_BUDGET), "--format", "json"]
        result = CliRunner().invoke(app, ["activations", *args])
        return result.exit_code, json.loads(result.stdout)["plan"] if result.exit_code == 0 else None

    # `--budget` at s: it fits as it is; at s + 1 it does not (a plan is needed, or none fits).
    code, plan = budget_check(size)
    assert code == 0 and plan is not None and plan["checkpoint"] == [] and plan["peak_bytes"] <= FIT_BUDGET
    code, plan = budget_check(size + 1)
    assert code == 1 or (plan is not None and plan["checkpoint"]), (code, plan)
