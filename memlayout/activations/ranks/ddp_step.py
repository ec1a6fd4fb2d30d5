"""One DistributedDataParallel rank's training step, traced on fake tensors under torch's fake process group.

FSDP2's ranks are accounted by torch's FSDPMemTracker (rank_step.py); a DDP rank is
traced by memlayout's own tracer, as one device's step is (analysis.py), since DDP
changes no op of the step: it adds the Reducer's buckets and what it runs around
forward and in backward's hooks, all of which go through the dispatcher and are seen.

The model is built in the fake world (analysis.prepare_step), then wrapped by the code the report prints (ddp.py), inside FakeTensorMode so that the
Reducer's buckets are fake too, with DDP's reduction replaced by `ddp.BucketRecorder`
(why: ddp.py). Two steps run untraced: the first makes the gradients ready in backward's
order, the second's forward rebuilds the buckets in it. The third is traced, the buckets
counted from its start as the parameters are. Every rank runs the same step on its own
batch of the same shapes, with the bucket layout rank 0 broadcasts, so rank 0 stands for
every rank.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from memlayout import _torch
from memlayout.activations.analysis import _step_failed, prepare_step
from memlayout.activations.ranks.ddp import BucketRecorder, DdpLayout, run_ddp_code
from memlayout.activations.ranks.facts import RankPeak
from memlayout.activations.ranks.parallel import Sharding
from memlayout.activations.ranks.rank_step import _torch_quieted, fake_world, local_shard_bytes
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.step.optimizer import build_optimizer, state_dtype
from memlayout.activations.step.run import run_step
from memlayout.activations.summary import PeakAt, summarize
from memlayout.errors import MemlayoutError

WARM_UP_STEPS = 2
"""Untraced steps before the one traced: DDP's buckets are rebuilt in the second step's forward."""
WRAPPER = "module"
"""The attribute DistributedDataParallel keeps the model in: the prefix of every module path the trace records."""


class DdpTrace(NamedTuple):
    """One traced DDP rank, and what the step said besides its peak."""

    peak: RankPeak
    layout: DdpLayout
    inputs: tuple[str, ...]
    loss: str
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    """What building the model said (analysis.prepare_step's notes)."""
    optimizer_state_dtype: str | None
    target: str | None
    kind: str
    model_class: str
    class_chosen_by: str
    """Why the model is of its class (analysis.prepare_step's last value)."""


def trace_ddp_rank(request: StepRequest, sharding: Sharding) -> DdpTrace:
    """Trace the steady-state step of rank 0 of `sharding.world_size` under DDP (`sharding.ddp`), its plan applied."""
    warned: list[str] = []
    with fake_world(sharding.world_size, 0), _torch_quieted(warned):
        # The optimizer's state comes from the first untraced step below, which has to run backward for DDP.
        step, notes, target_text, kind, chosen_by = prepare_step(request, mode="fake", optimizer="none")
        with step.context():
            step.optimizer = build_optimizer(step.model, request.step_optimizer, device=step.device,
                                             implementation=step.recipe.optimizer_impl)
        model_class = type(step.model).__name__
        recorder = BucketRecorder()
        try:
            with step.context(), _torch.ddp_parameter_check_skipped():
                step.model = run_ddp_code(sharding.code(), step.model)
            step.model.register_comm_hook(None, recorder.reduce)
            for warm_up in range(WARM_UP_STEPS):
                recorder.clear()  # the buckets a rebuild frees must not be kept alive here
                if warm_up:
                    with step.step_context(), _floating_buffers_fake(step.fake_mode):
                        _torch.ddp_rebuild_buckets(step.model)
                with step.step_context():
                    run_step(step.model, step.args, step.kwargs, autocast=step.autocast)
                if step.optimizer is not None:
                    with step.step_context(default_device=False):
                        step.optimizer.step()
                        step.optimizer.zero_grad(set_to_none=True)
            assert sharding.ddp is not None
            layout = recorder.layout(sharding.ddp)
            kept = recorder.tensors()
            recorder.clear()
            trace = step.trace(kept=kept)
            del kept
        except MemlayoutError:
            raise
        except Exception as exc:  # the model's own forward or backward failed under DDP
            raise _step_failed(exc, step) from exc
        recorder.clear()
        summary = summarize(trace)
        peak = RankPeak.of_trace(summary, sharding.world_size, local_shard_bytes(step.model),
                                 _unwrapped(summary.peak_at))
    return DdpTrace(peak, layout, step.descriptions, trace.loss, tuple(dict.fromkeys(warned)), tuple(notes),
                    state_dtype(step.optimizer), target_text, kind, model_class, chosen_by)


def _unwrapped(at: PeakAt) -> PeakAt:
    """Where the peak is, named from the model as the user holds it: `module.layers.0` is `layers.0`."""
    # A checkpointed module's rerun is part of backward, and nothing before the step makes a peak in it.
    phase = {"recompute": "backward", "setup": "forward"}.get(at.phase, at.phase)
    if at.module is None or not (at.module == WRAPPER or at.module.startswith(WRAPPER + ".")):
        return PeakAt(at.module, at.class_name, phase)  # outside the model, or in DDP's own forward ("")
    return PeakAt(module=at.module.removeprefix(WRAPPER).removeprefix("."), class_name=at.class_name, phase=phase)


def _floating_buffers_fake(fake_mode: Any) -> Any:
    """A mode under which a floating tensor made from nothing (`torch.empty`) is fake whatever its size: entered
    while DDP's Reducer rebuilds its buckets (`at::empty`).

    A fake step on the CPU keeps a small tensor made from nothing real (fake_step.py: a mask, position
    ids), so a bucket under 64 MiB would be real memory here, and its views plain tensors, which
    FakeTensorMode copies into a fake each time backward copies a gradient in. The Reducer's
    integer tensors (the bucket indices it broadcasts, written through accessors) stay real.
    """
    import torch

    class FloatingBuffersFake(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.ops.aten.empty.memory_format and kwargs.get("dtype", torch.get_default_dtype()) in (
                    torch.float32, torch.float64, torch.float16, torch.bfloat16):
                with _torch.disable_dispatch_modes(), fake_mode:
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    return FloatingBuffersFake()  # type: ignore[no-untyped-call]
