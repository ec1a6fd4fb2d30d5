"""Predictions checked against real ranks: two gloo processes on this CPU, each measured by FSDPMemTracker."""

from __future__ import annotations

from pathlib import Path

from memlayout.activations.parallel import ShardingOptions
from memlayout.activations.ranks import analyze_ranks
from tests.activations import real_ranks
from tests.activations.sharded_models import BATCH_SPECS

MODEL = "tests.activations.sharded_models:llama_style"
BATCH = "tests.activations.sharded_models:token_batch"


def test_the_prediction_of_each_rank_is_the_real_ranks_peak(tmp_path: Path) -> None:
    measured = real_ranks.peaks(real_ranks.run_ranks(real_ranks.measure_step, 2, tmp_path, MODEL, None, BATCH))
    report = analyze_ranks(MODEL, list(BATCH_SPECS), sharding=ShardingOptions(world_size=2))
    predicted = {r.rank: r.peak_bytes for r in report.ranks}
    # The MLP width is odd, so the two ranks hold different shards and both are traced.
    assert set(predicted) == {0, 1} and measured[0] != measured[1]
    for rank, peak in measured.items():
        assert abs(predicted[rank] - peak) <= 0.02 * peak, (rank, predicted[rank], peak)
    assert report.summary.peak_bytes == max(predicted.values())
