"""One rank of tensor-parallel serving (`--step inference` with `--world-size K --tp K`), traced on fake tensors
under torch's fake process group.

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
(tests/activations/test_tp_serving.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from memlayout.activations.ranks.facts import RankPeak
from memlayout.activations.ranks.parallel import Sharding, run_code
from memlayout.activations.ranks.rank_step import StepInputs, _torch_quieted, fake_world
from memlayout.activations.summary import Summary, summarize
from memlayout.activations.trace.world import StepWorld
from memlayout.errors import MemlayoutError, RankStepError, UsageError

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
) -> ServingTrace:
    """Trace rank 0 of `sharding.world_size` serving: one forward, eval mode, inference mode."""
    import torch

    check_torch(torch.__version__)
    warned: list[str] = []
    with fake_world(sharding.world_size, 0), _torch_quieted(warned):
        model = build()
        run_code(sharding.code(), model, torch.device(device).type)
        step = StepWorld("fake", device)
        with step.context():
            model.to_empty(device=device)
        model.eval()  # as serving code runs it: dropout off, norms on their running statistics
        step.model = model
        step.inference = True
        step.initial_modules = frozenset((path, type(m).__name__) for path, m in model.named_modules())
        step.make_inputs(step_inputs.inputs, step_inputs.kwargs)
        if sharding.model_dtype:
            step.cast_inputs(getattr(torch, sharding.model_dtype))  # as `analyze` feeds a model cast by --dtype
        if not step.args and not step.kwargs:
            raise UsageError("no inputs to run the step with",
                             "give --input SPEC (each rank's batch) or --inputs pkg.mod:make_inputs")
        step.add_optimizer("none")
        try:
            trace = step.trace()
        except MemlayoutError:
            raise
        except Exception as exc:  # the model's own forward failed with its projections split
            text = str(exc).splitlines()[0] if str(exc) else ""
            raise RankStepError(
                f"the step failed on rank 0 of {sharding.world_size} with tensor parallel applied: "
                f"{type(exc).__name__}: {text}",
                "a model that reshapes by a head count it keeps as an attribute cannot run tensor parallel as it is; "
                "--debug shows the traceback",
            ) from exc
        summary = summarize(trace)
        peak = _rank_peak(summary, sharding, model)
    return ServingTrace(peak, step.descriptions, tuple(dict.fromkeys(warned)), type(model).__name__)


def _rank_peak(summary: Summary, sharding: Sharding, model: Any) -> RankPeak:
    """The trace's peak in the ranks report's kinds (they add up to the peak)."""
    at = summary.at_peak
    shards = (p.to_local() if hasattr(p, "to_local") else p for p in model.parameters())
    return RankPeak(
        rank=0,
        same_layout=((0, sharding.world_size - 1),),
        peak_bytes=summary.peak_bytes,
        parameter_bytes=at["parameters"],
        buffer_bytes=at["buffers"],
        gradient_bytes=0,
        optimizer_bytes=0,
        activation_bytes=at["saved_activations"],
        temporary_bytes=at["other"],
        input_bytes=at["inputs"],
        communication_bytes=at.get("communication", 0),
        peak_at=summary.peak_at,
        shard_bytes=sum(t.numel() * t.element_size() for t in shards),
        tracker=dict(at),
        forward_flops=summary.forward_flops,
    )
