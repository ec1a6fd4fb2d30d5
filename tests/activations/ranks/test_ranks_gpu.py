"""CUDA: one rank's FSDP2 step predicted on fake ranks, against the real step's torch.cuda.max_memory_allocated.

World size 1 on one GPU (nccl): the prediction runs first, in this process on the
fake process group, then the real step on a real one. Skipped without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.parallel import ShardingOptions
from tests.activations.sharded_models import BATCH_SPECS, llama_style, token_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_one_rank_on_cuda_is_within_5_percent_of_max_memory_allocated(tmp_path: Path) -> None:
    import torch.distributed as dist

    report = analyze_ranks("tests.activations.sharded_models:llama_style", list(BATCH_SPECS),
                           sharding=ShardingOptions(world_size=1), device="cuda")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = llama_style().cuda()
        namespace: dict[str, object] = {}
        exec(compile(report.sharding.code(), "shard", "exec"), namespace)
        namespace["shard"](model, "cuda")  # type: ignore[operator]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        batch = {k: v.cuda() for k, v in token_batch().items()}
        for _ in range(2):  # the second step is the steady state the prediction is of
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            model(**batch)["loss"].backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        # What the first step left that is not the model's: cuBLAS's workspaces, one per
        # thread that ran a matmul (forward's and autograd's), which torch takes from the
        # caching allocator. On an H200 they were 65 MiB: the prediction is of the step's
        # tensors, so they are left out of the measured peak, as test_gpu.py leaves them.
        tensors = [*model.parameters(), *batch.values(),
                   *(v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # FSDP2's DTensors
        state = sum(
            storage.nbytes() for storage in {t.untyped_storage().data_ptr(): t.untyped_storage() for t in local
                                             if t.is_cuda}.values()
        )
        measured = torch.cuda.max_memory_allocated() - (before - state)
    finally:
        dist.destroy_process_group()
    predicted = report.summary.peak_bytes
    assert abs(predicted - measured) <= 0.05 * measured, (predicted, measured)
