"""One rank's training step, traced on fake tensors under torch's fake process group.

The model is built on the meta device, sharded there, and only then made fake on the
step's device (see ranks/__init__.py for why the order matters); torch's
`FSDPMemTracker` accounts the step's memory per kind, as on a real rank.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from memlayout import _torch
from memlayout.activations.device.expandable_segments import AllocatorConfig
from memlayout.activations.device.gpus import GpuSpec
from memlayout.activations.ranks import cuda_devices
from memlayout.activations.ranks.allocations import AllocationLog, recording_tracker
from memlayout.activations.ranks.facts import RankPeak
from memlayout.activations.ranks.parallel import Sharding, run_code
from memlayout.activations.step import gpu_free_backward
from memlayout.activations.step.optimizer import build_optimizer, state_dtype
from memlayout.activations.step.recipe import Recipe
from memlayout.activations.step.run import AfterBackward, Autocast, pick_loss, run_step
from memlayout.activations.summary import PeakAt
from memlayout.activations.trace import tensor_parallel
from memlayout.activations.trace.kernels import forward_flops
from memlayout.activations.trace.world import StepWorld
from memlayout.errors import MemlayoutError, RankStepError, UsageError


@contextmanager
def fake_world(world_size: int, rank: int) -> Iterator[None]:
    """This process plays `rank` of `world_size` under torch's fake process group, then leaves it."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise UsageError(
            "a process group is already initialized in this process, and predicting ranks needs a fake one of its own",
            "run the prediction in a process that has not called init_process_group",
        )
    dist.init_process_group("fake", store=_torch.FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def _torch_quieted(warned: list[str]) -> Iterator[None]:
    """Nothing from torch on stderr while a rank is traced: the report says it.

    FakeTensorMode logs every kernel that raises, traceback and all (the step's own
    error says what failed), and FSDP2 warns about the model (a block returning a
    view, say): those warnings become the report's notes.
    """
    import logging
    import warnings

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        log.setLevel(level)
        warned.extend(str(w.message) for w in caught)


class RankTrace(NamedTuple):
    """One traced rank, and what the step said besides its peak."""

    peak: RankPeak
    inputs: tuple[str, ...]
    """The inputs' descriptions."""
    loss: str
    """How the loss was picked."""
    warnings: tuple[str, ...]
    optimizer_state_dtype: str | None = None
    """The dtype of the optimizer's state tensors, read off the optimizer torch built (None: no state)."""


def meta_copy(model: Any) -> Any:
    """A copy of a live model with every parameter and buffer on the meta device (no memory)."""
    import torch

    memo: dict[int, Any] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) in memo:
            continue
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            meta = torch.nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


class _ForwardFlops:
    """Forward FLOPs of the local ops one rank runs (DTensor ops counted once, as their local ops)."""

    def __init__(self) -> None:
        from torch.distributed.tensor import DTensor

        counter = self

        class Mode(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call]
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if any(t is DTensor for t in types):
                    return NotImplemented  # let DTensor run its local ops, which come back here
                out = func(*args, **(kwargs or {}))
                counter.flops += forward_flops(func, args, kwargs or {}, out)
                return out

        self.flops = 0
        self.mode = Mode()  # type: ignore[no-untyped-call]


def _phase(state: Any) -> str:
    return "backward" if "BW" in str(getattr(state, "name", state)) else "forward"


def _class_name(module: Any) -> str:
    """The model's own class of a module, not the FSDP<class> subclass fully_shard swaps in."""
    from torch.distributed.fsdp import FSDPModule

    cls = type(module)
    if issubclass(cls, FSDPModule) and len(cls.__bases__) == 2:
        cls = cls.__bases__[1]
    return cls.__name__


def _peak_at(tracker: Any, model: Any, peak: int, device: Any, fallback: str) -> PeakAt:
    """The innermost wrapped module whose own peak snapshot is the step's peak, and its phase."""
    paths = {id(module): path for path, module in model.named_modules()}
    best: tuple[int, str, str, str] | None = None
    for module, stats in tracker.memory_tracking.items():
        path = paths.get(id(module))
        if path is None:
            continue
        for state, snapshots in stats.snapshots.items():
            if "PEAK" not in str(getattr(state, "name", state)):
                continue
            if any(snapshot.get(device, {}).get("Total") == peak for snapshot in snapshots):
                depth = path.count(".") + (1 if path else 0)
                class_name = _class_name(module)
                if best is None or depth > best[0]:
                    best = (depth, path, class_name, _phase(state))
    if best is None:
        return PeakAt(module=None, class_name=None, phase=fallback)
    return PeakAt(module=best[1], class_name=best[2], phase=best[3])


_KINDS = {
    "Sharded Param": "parameter", "Unsharded Param": "parameter", "Buffer": "buffer",
    "Sharded Grad": "gradient", "Unsharded Grad": "gradient", "Activation": "activation", "Temp": "temporary",
    "All Gather": "communication", "Reduce Scatter": "communication", "OptState": "optimizer", "Inputs": "input",
}


@dataclass(frozen=True)
class StepInputs:
    """What the step is fed, as `analyze` takes it."""

    inputs: Any
    kwargs: Mapping[str, Any] | None


@dataclass(frozen=True)
class RankSettings:
    """How each traced rank's step runs: the same for every rank and every sharding tried."""

    optimizer: str
    """The optimizer's name (step/optimizer.py)."""
    device: str
    """The step's device, as `--device` names it."""
    autocast: Autocast | None = None
    """Mixed precision around forward and loss."""
    allocator: AllocatorConfig | None = None
    """With it, the caching allocator's model replays the rank's own allocations (ranks/allocations.py)."""
    recipe: Recipe | None = None
    """The training recipe (step/recipe.py); None: the default one."""
    gpu: GpuSpec | None = None
    """On CUDA without a GPU, the step runs as on it (trace/fake_cuda.py; None: the default GPU)."""


def trace_rank(
    build: Callable[[], Any],
    sharding: Sharding,
    rank: int,
    same_layout: tuple[tuple[int, int], ...],
    step_inputs: StepInputs,
    settings: RankSettings,
) -> RankTrace:
    """Trace one steady-state step of `rank` with `sharding` applied, as `settings` say (forward and loss under
    their autocast; with their allocator, the caching allocator's model replays the rank's own allocations)."""
    warned: list[str] = []
    device, allocator = settings.device, settings.allocator
    with fake_world(sharding.world_size, rank), _torch_quieted(warned), device_queries(device, rank):
        step = sharded_step(build, sharding, step_inputs, device, gpu=settings.gpu)
        step.autocast = settings.autocast
        step.recipe = settings.recipe or Recipe()
        log = AllocationLog(torch_device_type(device)) if allocator is not None else None
        try:
            tracker, how, flops = _tracked_step(step, settings.optimizer, log)
        except MemlayoutError:
            raise
        except Exception as exc:
            raise step_failed(exc, rank, sharding) from exc
        peak = _rank_peak(tracker, step.model, rank, same_layout, flops, "optimizer" if step.optimizer else "loss")
        if log is not None and allocator is not None:
            peak = replace(peak, reserved=log.reserved(expandable=allocator.expandable_segments))
    return RankTrace(peak, step.descriptions, how, tuple(dict.fromkeys(warned)), state_dtype(step.optimizer))


def step_failed(exc: Exception, rank: int, sharding: Sharding) -> RankStepError:
    """The one-line error for a model whose own step failed on a rank with the sharding applied."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return RankStepError(
        f"the step failed on rank {rank} of {sharding.world_size} with the sharding applied: "
        f"{type(exc).__name__}: {text}",
        "a model that reshapes by a head count it keeps as an attribute cannot run tensor parallel as "
        "it is; --debug shows the traceback" if sharding.tp > 1 else "--debug shows the traceback",
    )


def local_shard_bytes(model: Any) -> int:
    """Bytes of this rank's parameters: a sharded one (a DTensor, FSDP2's or tensor parallel's) by its local shard."""
    local = (tensor_parallel.local(p) for p in model.parameters())
    return sum(t.numel() * t.element_size() for t in local)


def _ties(model: Any) -> list[list[tuple[Any, str]]]:
    """(module, attribute) of each Parameter registered in more than one place, grouped by Parameter."""
    places: dict[int, list[tuple[Any, str]]] = {}
    for module in model.modules():
        for name, parameter in module._parameters.items():
            if parameter is not None:
                places.setdefault(id(parameter), []).append((module, name))
    return [group for group in places.values() if len(group) > 1]


def sharded_step(build: Callable[[], Any], sharding: Sharding, step_inputs: StepInputs, device: str, *,
                 serving: bool = False, gpu: GpuSpec | None = None) -> Any:
    """The model built on the meta device, sharded by the sharding's code, then made fake on `device`; its inputs.
    Training, the model is in train mode; `serving`, in eval mode under inference mode, as serving code runs it."""
    import torch

    model = build()
    step = StepWorld("fake", device, gpu)
    cuda = torch.device(device).type == "cuda"
    with cuda_devices.made_fake(step.fake_mode) if cuda else contextlib.nullcontext():
        run_code(sharding.code(), model, torch.device(device).type)
    ties = _ties(model)
    with step.context():
        model.to_empty(device=device)
    # to_empty gives each module a new Parameter of its own, so a weight tied by sharing one Parameter (an
    # embedding and its output layer) counted twice where FSDP2 does not register it again: the zoo's Gemma 2
    # and LFM2-MoE served by tensor parallelism were 12,672 B over real ranks, their [99, 32] embedding.
    for first, *others in ties:
        for module, name in others:
            setattr(module, name, getattr(first[0], first[1]))
    if serving:
        model.eval()  # dropout off, norms on their running statistics
        step.inference = True
        step.initial_modules = frozenset((path, type(m).__name__) for path, m in model.named_modules())
    else:
        model.train()
    step.model = model
    step.make_inputs(step_inputs.inputs, step_inputs.kwargs)
    if sharding.model_dtype:
        step.cast_inputs(getattr(torch, sharding.model_dtype))  # as `analyze` feeds a model cast by --dtype
    if not step.args and not step.kwargs:
        raise UsageError("no inputs to run the step with",
                         "give `input` SPEC (one rank's batch) or `inputs` pkg.mod:make_inputs")
    return step


def device_queries(device: str, rank: int) -> Any:
    """On CUDA, the rank's device answers FSDP2's and DTensor's queries where no GPU is (cuda_devices.py)."""
    from contextlib import nullcontext

    return cuda_devices.answering(rank) if torch_device_type(device) == "cuda" else nullcontext()


def torch_device_type(device: str) -> str:
    """cuda for cuda:1, cpu for cpu."""
    return device.partition(":")[0]


def _tracked_step(step: Any, optimizer: str, log: AllocationLog | None = None) -> tuple[Any, str, int]:
    """A first step, untraced, then the steady-state step under FSDPMemTracker.

    The first step makes the optimizer's state, as in training (the step measured
    is the second), and counts the forward's FLOPs. Nothing runs under the default
    device: the model and inputs are on it already, and torch keeps an optimizer's
    step counts on the CPU. Under `step.autocast`, both steps run forward and loss
    in it, as a mixed-precision training loop does every step.

    Both steps run under the fake step's rules (trace/fake_step.py), as one device's
    step and a DDP rank's do: on the CPU, small values computed from the inputs stay
    real, so the model reads the values the real rank does. Without them transformers'
    Llama, given no cache (checkpointing sets `use_cache` off), saw fake position ids,
    could not rule out packed sequences, and built a [2, 1, 128, 128] boolean causal
    mask the real rank never makes: 32,768 B over the real ranks' peak with any
    checkpointing, whole blocks or op-level.
    """
    from contextlib import nullcontext

    counter = _ForwardFlops()
    # On fake CUDA without a GPU: attention as the target GPU runs it, and backward in memlayout's loop
    # (trace/fake_cuda.py), which runs FSDP2's hooks as torch's engine does (step/gpu_free_backward.py).
    with step.step_context(default_device=False):
        step.optimizer = build_optimizer(step.model, optimizer, device=step.device,
                                         implementation=step.recipe.optimizer_impl)
        with step.autocast.context() if step.autocast is not None else nullcontext():
            with counter.mode:
                output = step.model(*step.args, **step.kwargs)
            loss, how = pick_loss(output)
            del output
        if gpu_free_backward.wanted():
            holder = [loss]
            del loss
            gpu_free_backward.run_backward(holder)
        else:
            loss.backward()
            del loss
        if step.optimizer is not None:
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
        if log is None:
            tracker = _torch.FSDPMemTracker(step.model, step.optimizer)
        else:
            log.name_streams(step.model)
            tracker = recording_tracker(step.model, step.optimizer, log)
        tracker.track_inputs((step.args, step.kwargs))
        with tracker:
            if log is not None:
                log.mark_step()
            run_step(step.model, step.args, step.kwargs, after=AfterBackward(step.optimizer, step.recipe.clip),
                     autocast=step.autocast)
    return tracker, how, counter.flops


def _rank_peak(tracker: Any, model: Any, rank: int, same_layout: tuple[tuple[int, int], ...], flops: int,
               fallback_phase: str) -> RankPeak:
    """FSDPMemTracker's peak snapshot, in the report's kinds (they add up to the peak)."""
    snapshot = tracker.get_tracker_snapshot("peak")
    where, kinds = next(iter(snapshot.items())) if snapshot else (None, {})
    total = int(kinds.get("Total", 0))
    named = {getattr(k, "value", str(k)): int(v) for k, v in kinds.items() if k != "Total"}
    totals = dict.fromkeys(set(_KINDS.values()), 0)
    for name, value in named.items():
        totals[_KINDS.get(name, "temporary")] += value
    return RankPeak(
        rank=rank,
        same_layout=same_layout,
        peak_bytes=total,
        parameter_bytes=totals["parameter"],
        buffer_bytes=totals["buffer"],
        gradient_bytes=totals["gradient"],
        optimizer_bytes=totals["optimizer"],
        activation_bytes=totals["activation"],
        temporary_bytes=totals["temporary"],
        input_bytes=totals["input"],
        communication_bytes=totals["communication"],
        peak_at=_peak_at(tracker, model, total, where, fallback_phase),
        shard_bytes=local_shard_bytes(model),
        tracker=named,
        forward_flops=flops,
    )
