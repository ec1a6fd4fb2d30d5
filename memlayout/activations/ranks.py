"""Each rank's training step under FSDP2 (and tensor parallel), predicted in one process.

One process plays one rank of N at a time: a fake process group (torch's own,
backend "fake") answers every collective at once with no other rank behind it,
and FakeTensorMode gives every tensor its shape, dtype and device but no memory.
torch's `FSDPMemTracker` (torch.distributed._tools.fsdp2_mem_tracker) does the
accounting, per rank and per kind (sharded and unsharded parameters, gradients,
optimizer state, activations, temporaries, all-gather and reduce-scatter
buffers), as it does on a real rank; run on fake tensors under the fake group it
gives the real rank's figure to the byte (measured: tests/activations/test_ranks_real.py).

The order matters. The device mesh is made before FakeTensorMode is entered
(`init_device_mesh` reads values), and so is every sharding call: FSDP2 and
DTensor build meshes of their own while they shard. So the model is built on the
meta device, sharded there by the same code the report prints, and only then
materialised as fake tensors (`to_empty`), where the step runs.

Which ranks are traced: FSDP2 splits dimension 0 of each parameter into
`torch.chunk` pieces, so with uneven shapes the first ranks hold one row more
than the last, and some ranks may hold nothing. Ranks whose pieces all have the
same shapes have the same step; one rank of each such layout is traced, the first
(rank 0, which always holds the largest pieces) included.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from memlayout.activations.optimizer import DEFAULT_OPTIMIZER, check_optimizer
from memlayout.activations.parallel import (
    COLWISE,
    Sharding,
    ShardingOptions,
    resolve_sharding,
    run_code,
)
from memlayout.activations.rank_facts import RankLayout, RankPeak, RanksReport
from memlayout.activations.summary import PeakAt
from memlayout.errors import MemlayoutError, UsageError

MAX_TRACED_LAYOUTS = 4
"""Distinct rank layouts traced at most: the largest, the smallest and two between."""


# ----------------------------------------------------------------------------------------------
# Which ranks differ


def _local_rows(rows: int, parts: int, index: int) -> int:
    """Rows of dimension 0 that `torch.chunk(rows, parts)` gives piece `index` (FSDP2's split)."""
    size = -(-rows // parts) if rows else 0
    return max(0, min(size, rows - index * size))


def rank_layouts(model: Any, sharding: Sharding) -> list[RankLayout]:
    """Ranks grouped by the shapes of their shards, the group of the largest shards first.

    Every parameter is sharded by FSDP2 on dimension 0 across the data-parallel
    ranks, after the tensor-parallel plan has split it across the tensor-parallel
    ones. Tensor-parallel splits are even (the plan refuses a degree that does not
    divide), so ranks differ only by their data-parallel index.
    """
    styles = {s.module: s.style for s in sharding.tp_plan}
    tp, dp = sharding.tp, sharding.data_parallel
    shapes: list[tuple[int, int]] = []  # (rows on dimension 0, bytes per row)
    for module_path, module in model.named_modules():
        style = styles.get(module_path)
        for name, parameter in module.named_parameters(recurse=False):
            shape = list(parameter.shape)
            if style == COLWISE and shape:
                shape[0] //= tp
            elif style is not None and name == "weight" and len(shape) > 1:
                shape[1] //= tp
            rows = shape[0] if shape else 1
            row_bytes = parameter.element_size()
            for dimension in shape[1:]:
                row_bytes *= dimension
            shapes.append((rows, row_bytes))
    groups: dict[tuple[int, ...], list[int]] = {}
    for index in range(dp):
        key = tuple(_local_rows(rows, dp, index) for rows, _ in shapes)
        groups.setdefault(key, []).append(index)
    layouts = [
        RankLayout(
            ranks=tuple(index * tp + t for index in indexes for t in range(tp)),
            shard_bytes=sum(rows * row_bytes for rows, (_, row_bytes) in zip(key, shapes, strict=True)),
        )
        for key, indexes in groups.items()
    ]
    return sorted(layouts, key=lambda layout: (-layout.shard_bytes, layout.ranks[0]))


def traced_layouts(layouts: Sequence[RankLayout]) -> list[RankLayout]:
    """The layouts worth a trace: all of them when few, else the largest, the smallest and two between."""
    if len(layouts) <= MAX_TRACED_LAYOUTS:
        return list(layouts)
    last = len(layouts) - 1
    picks = sorted({0, last // 3, 2 * last // 3, last})
    return [layouts[i] for i in picks]


def rank_ranges(ranks: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """[0, 1, 2, 5] -> ((0, 2), (5, 5))."""
    ranges: list[tuple[int, int]] = []
    for rank in sorted(ranks):
        if ranges and ranges[-1][1] == rank - 1:
            ranges[-1] = (ranges[-1][0], rank)
        else:
            ranges.append((rank, rank))
    return tuple(ranges)


# ----------------------------------------------------------------------------------------------
# One rank


@contextmanager
def fake_world(world_size: int, rank: int) -> Iterator[None]:
    """This process plays `rank` of `world_size` under torch's fake process group, then leaves it."""
    import torch.distributed as dist

    from memlayout import _torch

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


class RankStepError(MemlayoutError):
    """The step failed on the sharded model."""


def _meta_copy(model: Any) -> Any:
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

        from memlayout import _torch
        from memlayout.activations.kernels import forward_flops

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


def trace_rank(
    build: Callable[[], Any],
    sharding: Sharding,
    rank: int,
    same_layout: tuple[tuple[int, int], ...],
    step_inputs: StepInputs,
    *,
    optimizer: str,
    device: str,
) -> RankTrace:
    """Trace one steady-state step of `rank` with `sharding` applied."""
    warned: list[str] = []
    with fake_world(sharding.world_size, rank), _torch_quieted(warned):
        step = _sharded_step(build, sharding, step_inputs, device)
        try:
            tracker, how, flops = _tracked_step(step, optimizer)
        except MemlayoutError:
            raise
        except Exception as exc:
            text = str(exc).splitlines()[0] if str(exc) else ""
            raise RankStepError(
                f"the step failed on rank {rank} of {sharding.world_size} with the sharding applied: "
                f"{type(exc).__name__}: {text}",
                "a model that reshapes by a head count it keeps as an attribute cannot run tensor parallel as "
                "it is; --debug shows the traceback" if sharding.tp > 1 else "--debug shows the traceback",
            ) from exc
        peak = _rank_peak(tracker, step.model, rank, same_layout, flops, "optimizer" if step.optimizer else "loss")
    return RankTrace(peak, step.descriptions, how, tuple(dict.fromkeys(warned)))


def _sharded_step(build: Callable[[], Any], sharding: Sharding, step_inputs: StepInputs, device: str) -> Any:
    """The model built on the meta device, sharded by the sharding's code, then made fake on `device`; its inputs."""
    import torch

    from memlayout.activations.world import StepWorld

    model = build()
    run_code(sharding.code(), model, torch.device(device).type)
    step = StepWorld("fake", device)
    with step.context():
        model.to_empty(device=device)
    model.train()
    step.model = model
    step.make_inputs(step_inputs.inputs, step_inputs.kwargs)
    if not step.args and not step.kwargs:
        raise UsageError("no inputs to run the step with",
                         "give --input SPEC (one rank's batch) or --inputs pkg.mod:make_inputs")
    return step


def _tracked_step(step: Any, optimizer: str) -> tuple[Any, str, int]:
    """A first step, untraced, then the steady-state step under FSDPMemTracker.

    The first step makes the optimizer's state, as in training (the step measured
    is the second), and counts the forward's FLOPs. Nothing runs under the default
    device: the model and inputs are on it already, and torch keeps an optimizer's
    step counts on the CPU.
    """
    from memlayout import _torch
    from memlayout.activations.optimizer import build_optimizer
    from memlayout.activations.step import pick_loss, run_step

    counter = _ForwardFlops()
    with step.context(default_device=False):
        step.optimizer = build_optimizer(step.model, optimizer, device=step.device)
        with counter.mode:
            output = step.model(*step.args, **step.kwargs)
        loss, how = pick_loss(output)
        del output
        loss.backward()
        del loss
        if step.optimizer is not None:
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
        tracker = _torch.FSDPMemTracker(step.model, step.optimizer)
        tracker.track_inputs((step.args, step.kwargs))
        with tracker:
            run_step(step.model, step.args, step.kwargs, optimizer=step.optimizer)
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
    local = 0
    for parameter in model.parameters():
        tensor = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        local += tensor.numel() * tensor.element_size()
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
        shard_bytes=local,
        tracker=named,
        forward_flops=flops,
    )


# ----------------------------------------------------------------------------------------------
# The report


def _target_builder(target: Any, trust: bool, main_module: str | None) -> tuple[Callable[[], Any], str | None, str]:
    import torch

    if isinstance(target, torch.nn.Module):
        return (lambda: _meta_copy(target)), None, "module"
    from memlayout.activations.build import build_model
    from memlayout.activations.target import classify

    kind = classify(str(target)).kind

    def build() -> Any:
        # On the meta device: FSDP2 and DTensor shard a model there, before it becomes fake (see above).
        built = build_model(str(target), trust=trust, main_module=main_module, context=lambda: torch.device("meta"), world="meta",
                            device="meta", adopt=_meta_copy)
        return built.model

    return build, str(target), kind


def analyze_ranks(
    target: Any,
    inputs: Any = None,
    *,
    sharding: ShardingOptions,
    kwargs: Mapping[str, Any] | None = None,
    optimizer: str = DEFAULT_OPTIMIZER,
    budget: int | None = None,
    allow_offload: bool = False,
    device: str = "cpu",
    trust: bool = False,
    main_module: str | None = None,
) -> RanksReport:
    """Predict each rank's peak over a training step under FSDP2 (and tensor parallel), in this process.

    Args:
        target: An nn.Module (copied to the meta device, never run) or a TARGET string, as for `analyze`.
        inputs: One rank's batch: tensors, spec strings or a `pkg.mod:make_inputs` spec, as for `analyze`.
        sharding: World size, FSDP2 and tensor-parallel options.
        kwargs: Keyword inputs.
        optimizer: adamw (default), adam, sgd or none.
        budget: Bytes each rank's peak must fit in; adds a plan (`report.plan`), traced before it is returned.
        allow_offload: The plan may offload parameters, gradients and optimizer state to the CPU.
        device: The device the step is for.
        trust: Allow unpickling a module file.
        main_module: With `trust`, the module that defines what a script's pickle names `__main__.X`.

    Returns:
        A `RanksReport`: one `RankPeak` per distinct rank layout traced, the largest first.

    Raises:
        RanksBudgetUnreachableError: no plan fits `budget`; it carries the lowest plan found.

    Example:
        >>> from memlayout.activations import ShardingOptions, analyze_ranks  # doctest: +SKIP
        >>> report = analyze_ranks("model.json", ["input_ids=int64[1,4096]<32000"],
        ...                        sharding=ShardingOptions(world_size=64))
        >>> report.summary.peak_bytes  # the largest rank's
    """
    check_optimizer(optimizer)
    build, target_text, kind = _target_builder(target, trust, main_module)
    model = build()
    resolved = resolve_sharding(model, sharding)
    layouts = rank_layouts(model, resolved)
    model_class = type(model).__name__
    del model
    step_inputs = StepInputs(inputs, kwargs)
    traced = traced_layouts(layouts)
    described: dict[str, Any] = {}
    warned: dict[str, None] = {}

    def measure(with_sharding: Sharding, which: Sequence[RankLayout] = traced) -> tuple[RankPeak, ...]:
        peaks = []
        for layout in which:
            traced = trace_rank(
                build, with_sharding, layout.ranks[0], rank_ranges(layout.ranks), step_inputs, optimizer=optimizer,
                device=device,
            )
            described["inputs"], described["loss"] = traced.inputs, traced.loss
            warned.update(dict.fromkeys(traced.warnings))
            peaks.append(traced.peak)
        return tuple(peaks)

    peaks = measure(resolved)
    notes = list(resolved.notes) + [f"torch warned while tracing: {message}" for message in list(warned)[:3]]
    if len(layouts) > len(peaks):
        notes.append(
            f"the ranks' shards come in {len(layouts)} different shapes; {len(peaks)} were traced, the largest shards "
            "(rank 0) among them"
        )
    report = RanksReport(
        target=target_text, target_kind=kind, model_class=model_class, inputs=described["inputs"], device=device,
        loss=described["loss"], optimizer=optimizer, sharding=resolved, ranks=peaks, layouts=len(layouts),
        notes=tuple(notes),
    )
    if budget is None:
        return report
    from memlayout.activations.ranks_plan import plan_ranks

    def single_device() -> Any:
        from memlayout.activations.analysis import analyze

        return analyze(target, inputs, kwargs=kwargs, optimizer=optimizer, device=device, trust=trust,
                       main_module=main_module)

    # Plans are searched on the largest rank alone (rank 0 holds the largest shards, and the
    # ranks' steps differ only by their shards); the plan found is then traced on every layout.
    plan, plan_notes = plan_ranks(
        report, budget, measure=lambda s: measure(s, traced[:1]), single_device=single_device, model=build(),
        allow_offload=allow_offload,
    )
    if len(traced) > 1 and not plan.empty:
        plan = replace(plan, ranks=measure(plan.sharding))
    return replace(report, plan=plan, notes=report.notes + plan_notes)
