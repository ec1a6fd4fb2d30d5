"""One rank of tensor-parallel serving (`--step inference` or `generate` with `--world-size K --tp K`), traced on
fake tensors under torch's fake process group.

A serving rank is traced by memlayout's own tracer, as one device's step is (analysis.py) and as a DDP rank is
(ddp_step.py): tensor parallel changes which ops a rank runs, not how their memory is counted. The model is built on
the meta device and laid out there by the code the report prints, as FSDP2's ranks are (ranks/__init__.py: DTensor
builds its mesh from values), then made fake on the step's device. DTensor runs each op as ops on the rank's local
shards, with the collectives between them; those are the ops the tracer counts (trace/tracer.py). The plan shards
only dimensions --tp divides, so every rank holds shards of the same shapes and runs the same ops: rank 0 stands for
every rank.

torch 2.13 is refused. Under `torch.inference_mode` its DTensor decides a decomposed op's placement by trying each
candidate and catching the errors; each caught error's traceback keeps the forward's frames, with their
activations, alive until Python's cyclic collector runs. A real rank's peak then depends on when the collector runs:
on a 4-layer Llama-style model over 2 gloo ranks, 9,714,176 B with the collector off against 3,766,784 B on torch
2.14.1, where no error is left behind and the prediction is 4 B from the real rank
(tests/activations/ranks/test_tp_serving.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from memlayout.activations.ranks.facts import RankPeak
from memlayout.activations.ranks.parallel import Sharding
from memlayout.activations.ranks.rank_step import (
    StepInputs,
    _torch_quieted,
    fake_world,
    local_shard_bytes,
    sharded_step,
    step_failed,
)
from memlayout.activations.summary import summarize
from memlayout.errors import MemlayoutError, UsageError

if TYPE_CHECKING:
    from memlayout.activations.step.generate import Generation

FIRST_TORCH = (2, 14)
"""The first torch whose DTensor leaves no caught error, and no activation, behind a serving forward."""


class ServingTrace(NamedTuple):
    """One traced serving rank, and what the step said besides its peak."""

    peak: RankPeak
    inputs: tuple[str, ...]
    warnings: tuple[str, ...]
    model_class: str
    """The model's class as built (before tensor parallel, which keeps it)."""


def check_torch(version: str) -> None:
    """Raises UsageError on a torch whose serving ranks' peak depends on Python's cyclic collector (see above)."""
    release = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    if release < FIRST_TORCH:
        raise UsageError(
            f"tensor-parallel serving is traced on torch 2.14 or later, and this is torch {version}: its DTensor "
            "keeps a serving forward's activations alive in the tracebacks of the errors it catches, until Python's "
            "cyclic collector runs, so a real rank's peak depends on when that is",
            "install torch 2.14 or later (pip install 'torch>=2.14'), or predict one device without --world-size",
        )


def trace_serving_rank(
    build: Callable[[], Any],
    sharding: Sharding,
    step_inputs: StepInputs,
    *,
    device: str,
    generation: Generation | None = None,
) -> ServingTrace:
    """Trace rank 0 of `sharding.world_size` serving: one forward, or with `generation` one `model.generate`, in
    eval mode and inference mode."""
    import torch

    check_torch(torch.__version__)
    warned: list[str] = []
    with fake_world(sharding.world_size, 0), _torch_quieted(warned):
        step = sharded_step(build, sharding, step_inputs, device, serving=True)
        if generation is not None:
            step.generate(generation)
        step.add_optimizer("none")
        try:
            trace = step.trace()
        except MemlayoutError:
            raise
        except Exception as exc:  # the model's own forward failed with its projections split
            raise step_failed(exc, 0, sharding) from exc
        summary = summarize(trace)
        peak = RankPeak.of_trace(summary, sharding.world_size, local_shard_bytes(step.model), summary.peak_at)
    return ServingTrace(peak, step.descriptions, tuple(dict.fromkeys(warned)), type(step.model).__name__)
