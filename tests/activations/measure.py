"""Measuring a real step, independently of memlayout's tracer: the CPU allocator's own events, PyTorch's
MemTracker, a bare storage counter and a pack hook.

`allocator_peak_step` is the reference: torch.profiler with `profile_memory=True` records every
allocation and free the CPU allocator makes, kernel scratch included, which MemTracker and the
storage counter never see (they count op outputs only: oneDNN's convolution backward takes
scratch no output shows, and `F.mse_loss` frees an element-wise buffer inside the op).

These are the references the predictions are checked against (tests and
benchmarks/accuracy/bench_activations.py).

Under torch.utils.checkpoint MemTracker changes what it measures: its module
hooks keep tensors of the recomputed forward alive longer than the step itself
does. Measured on transformers' CpmAnt with ten modules checkpointed: 4,556,388
bytes with MemTracker attached, 4,458,084 without, both counted by
`storage_peak_step`'s counter in the same process. A planned step is therefore
also measured by `storage_peak_step`, which adds no hooks.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memlayout.activations.step.run import Autocast, pick_loss, run_step


def within_2_percent(predicted: int, measured: int) -> bool:
    """The tolerance a prediction is held to against a real step's measured peak."""
    return abs(predicted - measured) <= 0.02 * measured


@dataclass(frozen=True)
class RealStep:
    peak_bytes: int
    """The peak over the step, the model, its optimizer's state and the inputs counted: MemTracker's, or the
    bare storage counter's."""
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]


class _NoHook:
    def remove(self) -> None:
        pass


def user_optimizer(model: torch.nn.Module, name: str) -> torch.optim.Optimizer | None:
    """The optimizer as a training script writes it, torch's defaults where the name implies none."""
    if name == "none":
        return None
    parameters = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(parameters)
    if name == "adam":
        return torch.optim.Adam(parameters)
    assert name == "sgd", name
    return torch.optim.SGD(parameters, lr=0.01, momentum=0.9)


def _warm_up(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], seed: int, optimizer: str,
    autocast: Autocast | None = None,
) -> torch.optim.Optimizer | None:
    """Seed, and with an optimizer run one untracked step first, so the measured step is a steady-state one."""
    for parameter in model.parameters():
        parameter.grad = None
    torch.manual_seed(seed)
    stepper = user_optimizer(model, optimizer)
    if stepper is not None:
        run_step(model, args, kwargs, autocast=autocast)
        stepper.step()
        stepper.zero_grad(set_to_none=True)
    return stepper


def _take_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every gradient the step left, which are then cleared for the next measured step."""
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    for parameter in model.parameters():
        parameter.grad = None
    return grads


def memtracker_step(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], seed: int = 0, optimizer: str = "adamw",
    autocast: Autocast | None = None,
) -> RealStep:
    """Run one real training step under torch.distributed._tools.MemTracker; returns its peak, the loss and the
    gradients.

    With an optimizer, a first step runs untracked, so that the step measured is a steady-state one (the
    optimizer's state exists from its start), as MemTracker's own documentation measures the second iteration.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    stepper = _warm_up(model, args, kwargs, seed, optimizer, autocast)
    tracker = MemTracker()
    # MemTracker hooks every parameter's gradient, and torch refuses a hook on one that does not require grad:
    # a frozen parameter never gets a gradient, so it is marked as hooked already (MemTracker removes the
    # handles it finds there when it exits).
    for parameter in model.parameters():
        if not parameter.requires_grad:
            tracker._param_to_grad_hook_handles[parameter] = (_NoHook(), _NoHook())
    tracker.track_external(model, *args, *kwargs.values(), *([stepper] if stepper is not None else []))
    with tracker:
        loss, _ = run_step(model, args, kwargs, autocast=autocast)
        if stepper is not None:
            stepper.step()
    peak = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    grads = _take_gradients(model)
    return RealStep(peak_bytes=int(peak), loss=loss, grads=grads)


class _LiveStorages(TorchDispatchMode):
    """Live bytes of every storage an op returns, each once, from that op until the storage is freed; nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, weakref.ref[Any]] = {}

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        known = self._seen.get(id(storage))
        if known is not None and known() is storage:
            return
        size = storage.nbytes()

        def freed(_ref: Any, key: int = id(storage), size: int = size) -> None:
            self.live -= size
            self._seen.pop(key, None)

        self._seen[id(storage)] = weakref.ref(storage, freed)
        self.live += size
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                self.add(value)
        return out


def storage_peak_step(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], seed: int = 0, optimizer: str = "adamw",
    autocast: Autocast | None = None,
) -> RealStep:
    """The same steady-state step as `memtracker_step`, its peak counted by storages alone (no module hooks)."""
    stepper = _warm_up(model, args, kwargs, seed, optimizer, autocast)
    counter = _LiveStorages()
    state = [*model.parameters(), *model.buffers(), *args, *kwargs.values()]
    if stepper is not None:
        state += [v for s in stepper.state.values() for v in s.values()]
    for tensor in state:
        if isinstance(tensor, torch.Tensor):
            counter.add(tensor)
    with counter:
        loss, _ = run_step(model, args, kwargs, autocast=autocast)
        if stepper is not None:
            stepper.step()
    grads = _take_gradients(model)
    return RealStep(peak_bytes=counter.peak, loss=loss, grads=grads)


def state_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages among these values (tensors; anything else is skipped)."""
    seen: dict[tuple[int, int], int] = {}
    for tensor in tensors:
        if hasattr(tensor, "to_local"):  # a tensor-parallel parameter: this rank's shard is its memory
            tensor = tensor.to_local()
        if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided:
            storage = tensor.untyped_storage()
            seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
    return sum(seen.values())


@dataclass(frozen=True)
class AllocatorCount:
    """A profile's CPU allocator events, summed in the order they happened."""

    peak_bytes: int
    """The highest running sum, above what was live before the profile."""
    unfreed_bytes: int
    """What the profile saw allocated and never saw freed: what the profiled code returned, and any block freed on
    a thread the profiler does not watch (see `real_ranks.gloo_releases_first`)."""


def allocator_peak(events: Any) -> int:
    """The highest running sum of the CPU allocator's allocations and frees, in the order they happened.

    `events` are a profile's raw kineto events: the "[memory]" ones carry the bytes allocated (positive) or
    freed (negative). A free counts only against an allocation of its size earlier in this profile and not yet
    freed. torch's CPU allocator reports a free by the size it recorded for that address while profiling
    (c10/core/CPUAllocator.cpp, ProfiledCPUMemoryReporter): it records sizes and forgets them only while a
    profile runs, so a block allocated in one profile and freed outside any leaves its size behind, and a
    later block at the same address, allocated outside, is reported freed with the old size. In a long test
    process that lowered a plan's peak by 51,200 B (test_excluded.py in CI, on 2.14.1). A block from before
    the profile is then never counted, as the allocator would not count it either without such a stale size.
    """
    return allocator_count(events).peak_bytes


def allocator_count(events: Any) -> AllocatorCount:
    """`allocator_peak`'s running sum, with what it left unfreed."""
    from collections import Counter

    import torch.profiler

    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.profiler.DeviceType.CPU)
    open_sizes: Counter[int] = Counter()
    live = peak = 0
    for _, nbytes in memory:
        if nbytes > 0:
            open_sizes[nbytes] += 1
        elif open_sizes[-nbytes] > 0:
            open_sizes[-nbytes] -= 1
        else:
            continue
        live += nbytes
        peak = max(peak, live)
    return AllocatorCount(peak, live)


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The measured step without the cyclic collector: garbage from before it is collected first.

    The allocator's events are summed on top of what was live before the step, so freeing a tensor
    that was not counted there (an earlier step's graph in a reference cycle, which a collection
    during the step frees) lowers the measured peak. Whether the collector ran during the step
    depended on what the process had allocated before: one run of the whole suite measured a
    stateful recurrent model's planned step one [8, 48, 32] tensor low.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def allocator_peak_step(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], seed: int = 0, optimizer: str = "adamw",
    autocast: Autocast | None = None, other_state: tuple[Any, ...] = (),
) -> RealStep:
    """The same steady-state step as `memtracker_step`, its peak by the CPU allocator's own events.

    What was live before the step (parameters, buffers, inputs, the optimizer's state, and `other_state`: tensors
    the model keeps outside its parameters and buffers, such as bitsandbytes' quantization state) is counted once by
    storage, and the profile's allocations and frees are summed in order on top of it.
    """
    from torch.profiler import ProfilerActivity, profile

    stepper = _warm_up(model, args, kwargs, seed, optimizer, autocast)
    state = [*model.parameters(), *model.buffers(), *args, *kwargs.values(), *other_state]
    if stepper is not None:
        state += [v for s in stepper.state.values() for v in s.values()]
    before = state_bytes(state)
    with no_collection(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
        loss, _ = run_step(model, args, kwargs, autocast=autocast)
        if stepper is not None:
            stepper.step()
    peak = before + allocator_peak(profiled.profiler.kineto_results.events())
    grads = _take_gradients(model)
    return RealStep(peak_bytes=peak, loss=loss, grads=grads)


def saved_bytes_seen_by_pack_hook(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Bytes a saved_tensors_hooks pack hook sees in a real forward, once per storage, model state excluded,
    counting the storages still alive when backward would begin."""
    state = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: dict[int, tuple[Any, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in state:
            seen[id(storage)] = (weakref.ref(storage), storage.nbytes())
        return tensor.detach()  # the tensor itself would keep its node alive through grad_fn (a cycle)

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(*args, **kwargs)
        loss, _ = pick_loss(output)
        del output
        alive = {id(ref()): size for ref, size in seen.values() if ref() is not None}
    del loss
    return sum(alive.values())


def allocator_inference_peak(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """The peak of one forward as serving code runs it (eval mode, `torch.inference_mode`), by the CPU allocator's
    own events as `allocator_peak_step` takes a training step's: the model's state and the inputs counted once by
    storage, the profile's allocations and frees summed in order on top. A kernel's scratch counts here, as it
    does in the process's memory; a storage counter sees only what ops return. A first forward runs unprofiled, so
    that one-time allocations (oneDNN's primitive caches) are not taken for the step's."""
    before = state_bytes([*model.parameters(), *model.buffers(), *args, *kwargs.values()])
    return before + allocator_inference_count(model, args, kwargs).peak_bytes


def allocator_inference_count(model: torch.nn.Module, args: tuple[Any, ...],
                              kwargs: Mapping[str, Any]) -> AllocatorCount:
    """`allocator_inference_peak`'s profile, counted above the model's state and the inputs: its output is freed
    inside, so anything left unfreed is a free the profiler did not see."""
    from torch.profiler import ProfilerActivity, profile

    model.eval()
    torch.manual_seed(0)
    with torch.inference_mode():
        model(*args, **kwargs)
    torch.manual_seed(0)
    with (no_collection(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled,
          torch.inference_mode()):
        output = model(*args, **kwargs)
        del output
    return allocator_count(profiled.profiler.kineto_results.events())


def inference_peak(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """The peak of one forward as serving code runs it (eval mode, `torch.inference_mode`), counted by storages
    alone as `storage_peak_step` counts a training step: the model's state and the inputs from the start, then
    every storage an op returns until it is freed. torch's own context managers, not memlayout's step."""
    model.eval()
    counter = _LiveStorages()
    for tensor in [*model.parameters(), *model.buffers(), *args, *kwargs.values()]:
        if isinstance(tensor, torch.Tensor):
            counter.add(tensor)
    torch.manual_seed(0)
    with counter, torch.inference_mode():
        output = model(*args, **kwargs)
    del output
    return counter.peak


def allocator_generate_peak(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                            **generate: Any) -> tuple[int, torch.Tensor]:
    """The peak of `model.generate(*args, **kwargs, **generate)` as serving code runs it (eval mode,
    `torch.inference_mode`), by the CPU allocator's own events as `allocator_inference_peak` takes a forward's, and
    the ids it returned. A first generate runs unprofiled, so that one-time allocations are not taken for its own."""
    before = state_bytes([*model.parameters(), *model.buffers(), *args, *kwargs.values()])
    count, ids = allocator_generate_count(model, args, kwargs, **generate)
    return before + count.peak_bytes, ids


def allocator_generate_count(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                             **generate: Any) -> tuple[AllocatorCount, torch.Tensor]:
    """`allocator_generate_peak`'s profile, counted above the model's state and the inputs, and the ids it returned:
    what it leaves unfreed beyond those ids is a free the profiler did not see."""
    from torch.profiler import ProfilerActivity, profile

    model.eval()
    with torch.inference_mode():
        model.generate(*args, **kwargs, **generate)
    with (no_collection(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled,
          torch.inference_mode()):
        ids = model.generate(*args, **kwargs, **generate)
    return allocator_count(profiled.profiler.kineto_results.events()), ids
