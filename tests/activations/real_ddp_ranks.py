"""Real DistributedDataParallel ranks for the tests: gloo processes on this machine, judged by the CPU allocator.

Each rank builds the model, wraps it in torch's DistributedDataParallel (by hand,
with the options given, or by the code a report prints), and runs four AdamW
steps, written here by hand as a training loop writes them, not with memlayout's
step. The last is measured. DDP puts every parameter in one bucket at
construction and rebuilds its buckets in the second step's forward, in the order
the first backward made the gradients ready, so from the third step on the step
is the one training repeats. The fourth, not the third, because gloo's worker
threads let go of a reduced bucket only when they next take work: on this busy
machine the bucket DDP's construction made was once still held in the third step
(GPT-2, 689 KB more on rank 0, in one run of seven).

The measure is the CPU allocator's own events (torch.profiler with
`profile_memory=True`), from before DDP is built to the end: the bytes live before
the profile (the parameters, the buffers and the batch) are counted once by
storage, and the allocations and frees after are summed in order
(`measure.allocator_peak`'s rule); the measured step's peak is the highest sum
inside its `record_function` range.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.activations import real_ranks

MEASURED = "measured step"
STEPS = 4


def _measured_step_peak(events: Any, before: int) -> int:
    """The highest running sum of the allocator's events inside the measured step's range, plus `before`."""
    import torch.profiler

    (window,) = [(e.start_ns(), e.end_ns()) for e in events if e.name() == MEASURED]
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.profiler.DeviceType.CPU)
    open_sizes: Counter[int] = Counter()
    live = peak = 0
    for at, nbytes in memory:
        if nbytes > 0:
            open_sizes[nbytes] += 1
        elif open_sizes[-nbytes] > 0:
            open_sizes[-nbytes] -= 1
        else:
            continue
        if at < window[0]:
            peak = live + nbytes  # the bytes live when the step begins
        live += nbytes
        if window[0] <= at <= window[1]:
            peak = max(peak, live)
    return before + peak


def _loss(output: Any) -> Any:
    """`output.loss` where the model computes one, else the sum of the output (a plain tensor)."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    return loss if loss is not None else output.sum()


def measure_ddp_step(rank: int, world_size: int, store: str, out: str, builder: str, batch_builder: str,
                     ddp_options: dict[str, Any], code: str | None = None,
                     batch_options: dict[str, Any] | None = None) -> None:
    """One rank: build, wrap in DDP (`ddp_options`, or by `code`'s `wrap`), four AdamW steps, the last measured.

    The batch is `batch_builder(seed=1 + rank, **batch_options)`: each rank's own, of the same shapes.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile, record_function

    from tests.activations.measure import state_bytes

    real_ranks._join(rank, world_size, store)
    try:
        model = real_ranks._resolve(builder)()
        args, kwargs = real_ranks._resolve(batch_builder)(seed=1 + rank, **(batch_options or {}))
        before = state_bytes([*model.parameters(), *model.buffers(), *args, *kwargs.values()])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
            if code is None:
                wrapped = DistributedDataParallel(model, **ddp_options)
            else:
                namespace: dict[str, Any] = {}
                exec(compile(code, "<DDP code from the report>", "exec"), namespace)
                wrapped = namespace["wrap"](model)
            optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
            losses = []
            for step in range(STEPS):
                with record_function(MEASURED if step == STEPS - 1 else f"step {step}"):
                    loss = _loss(wrapped(*args, **kwargs))
                    loss.backward()
                    losses.append(loss.item())
                    del loss
                    optimizer.step()
                    optimizer.zero_grad()
        # DDP's own account of the buckets it rebuilt (its logging data): bytes, and the parameters in each.
        logged = wrapped._get_ddp_logging_data()
        result = {
            "rank": rank,
            "peak_bytes": _measured_step_peak(profiled.profiler.kineto_results.events(), before),
            "losses": losses,
            "bucket_bytes": [int(size) for size in logged["rebuilt_bucket_sizes"].split(", ")],
            "bucket_parameters": [len(indices.split()) for indices in
                                  logged["rebuilt_per_bucket_param_indices"].split(", ")],
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
