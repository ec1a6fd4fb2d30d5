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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memlayout.activations.analysis import LIVE_MODULE, analyze
from memlayout.activations.model.build import build_model
from memlayout.activations.model.target import classify
from memlayout.activations.ranks.ddp_step import trace_ddp_rank
from memlayout.activations.ranks.facts import RankLayout, RankPeak, RanksReport
from memlayout.activations.ranks.layouts import rank_layouts, rank_ranges, traced_layouts
from memlayout.activations.ranks.parallel import Sharding, ShardingOptions, resolve_sharding
from memlayout.activations.ranks.plan import plan_ranks
from memlayout.activations.ranks.rank_step import StepInputs, meta_copy, trace_rank
from memlayout.activations.ranks.serving_step import trace_serving_rank
from memlayout.activations.step.optimizer import DEFAULT_OPTIMIZER, check_optimizer
from memlayout.activations.step.run import LOSS_NONE, Autocast, torch_dtype
from memlayout.errors import UsageError

if TYPE_CHECKING:
    from memlayout.activations.step.generate import Generation

# ----------------------------------------------------------------------------------------------
# The report


def _target_builder(
    target: Any, trust: bool, main_module: str | None, model_class: str | None, chosen_by: dict[str, str]
) -> tuple[Callable[[], Any], str | None, str]:
    """Builds the model on the meta device; each build records why it is of its class in `chosen_by["class"]`."""
    import torch

    if isinstance(target, torch.nn.Module):
        chosen_by["class"] = LIVE_MODULE
        return (lambda: meta_copy(target)), None, "module"
    kind = classify(str(target)).kind

    def build() -> Any:
        # On the meta device: FSDP2 and DTensor shard a model there, before it becomes fake (see above).
        built = build_model(str(target), trust=trust, main_module=main_module, context=lambda: torch.device("meta"), world="meta",
                            device="meta", adopt=meta_copy, model_class=model_class)
        chosen_by["class"] = built.class_chosen_by
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
    autocast: str | None = None,
    dtype: str | None = None,
    model_class: str | None = None,
    generation: Generation | None = None,
) -> RanksReport:
    """Predict each rank's peak over a training step under FSDP2 (and tensor parallel), in this process; or, with
    `sharding.serving`, each rank's serving step under tensor parallel alone.

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
        autocast: bf16 or fp16: each rank's forward and loss under `torch.autocast` for the device's type,
            as for `analyze`; it composes with FSDP2's `param_dtype`, which decides what the gathered
            parameters are before autocast casts what each op computes in.
        dtype: bf16, fp16 or fp32: the model's floating parameters and buffers (and floating inputs) cast
            before tensor parallel and `fully_shard`, as pure low-precision training does; each shard and the
            optimizer's state are then in it. The sharding code the report prints casts first too.
        model_class: The transformers class a config builds, as for `analyze`.
        generation: With `sharding.serving` "generate", its new tokens and cache (step/generate.py).

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
    if autocast is not None and autocast not in ("bf16", "fp16"):
        raise UsageError(f"unknown --autocast {autocast!r}", "use bf16 or fp16")
    if dtype is not None:
        sharding = replace(sharding, model_dtype=str(torch_dtype(dtype)).removeprefix("torch."))
    mixed = Autocast("cuda" if device.startswith("cuda") else "cpu", autocast) if autocast is not None else None
    chosen_by: dict[str, str] = {}
    build, target_text, kind = _target_builder(target, trust, main_module, model_class, chosen_by)
    model = build()
    resolved = resolve_sharding(model, sharding)
    if sharding.serving is not None:
        if budget is not None:
            raise UsageError(f"--budget plans checkpoints for a training step, and --step {sharding.serving} runs no "
                             "backward to recompute in", "leave --budget out")
        if autocast is not None:
            raise UsageError(f"--autocast is not traced for --step {sharding.serving} across ranks yet",
                             f"--dtype {autocast} casts the model, as servers load it")
        if device != "cpu":
            raise UsageError(f"--step {sharding.serving} across ranks is traced for --device cpu, not {device}, yet: "
                             "the fake CUDA step does not run DTensor's device mesh",
                             "predict --device cpu (the same shards and ops), or one device's forward on --device cuda")
        if (sharding.serving == "generate") != (generation is not None):
            raise UsageError("--step generate and its --new-tokens go together", "e.g. --step generate --new-tokens 256")
        del model
        return _analyze_serving(build, resolved, StepInputs(inputs, kwargs), target_text, kind, chosen_by,
                                step=sharding.serving, device=device, dtype=dtype, generation=generation)
    if resolved.ddp is not None:
        return _analyze_ddp(target, inputs, kwargs, resolved, model, optimizer=optimizer, budget=budget,
                            allow_offload=allow_offload, device=device, trust=trust, main_module=main_module,
                            autocast=autocast, dtype=dtype, model_class=model_class)
    layouts = rank_layouts(model, resolved)
    built_class = type(model).__name__
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
                device=device, autocast=mixed,
            )
            described["inputs"], described["loss"] = traced.inputs, traced.loss
            described["state_dtype"] = traced.optimizer_state_dtype
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
        target=target_text, target_kind=kind, model_class=built_class, inputs=described["inputs"], device=device,
        loss=described["loss"], optimizer=optimizer, sharding=resolved, ranks=peaks, layouts=len(layouts),
        notes=tuple(notes), autocast=autocast, dtype=dtype, optimizer_state_dtype=described["state_dtype"],
        class_chosen_by=chosen_by["class"],
    )
    if budget is None:
        return report

    def single_device() -> Any:
        return analyze(target, inputs, kwargs=kwargs, optimizer=optimizer, device=device, trust=trust,
                       main_module=main_module, autocast=autocast, dtype=dtype, model_class=model_class)

    # Plans are searched on the largest rank alone (rank 0 holds the largest shards, and the
    # ranks' steps differ only by their shards); the plan found is then traced on every layout.
    plan, plan_notes = plan_ranks(
        report, budget, measure=lambda s: measure(s, traced[:1]), single_device=single_device, model=build(),
        allow_offload=allow_offload,
    )
    if len(traced) > 1 and not plan.empty:
        plan = replace(plan, ranks=measure(plan.sharding))
    return replace(report, plan=plan, notes=report.notes + plan_notes)


def _analyze_serving(
    build: Callable[[], Any], sharding: Sharding, step_inputs: StepInputs, target_text: str | None, kind: str,
    chosen_by: dict[str, str], *, step: str, device: str, dtype: str | None, generation: Generation | None,
) -> RanksReport:
    """Tensor-parallel serving: every rank alike, rank 0 traced (serving_step.py)."""
    traced = trace_serving_rank(build, sharding, step_inputs, device=device, generation=generation)
    notes = list(sharding.notes) + [f"torch warned while tracing: {message}" for message in traced.warnings[:3]]
    return RanksReport(
        target=target_text, target_kind=kind, model_class=traced.model_class, inputs=traced.inputs, device=device,
        loss=LOSS_NONE, optimizer="none", sharding=sharding, ranks=(traced.peak,), layouts=1, notes=tuple(notes),
        dtype=dtype, class_chosen_by=chosen_by["class"], step=step,
    )


def _analyze_ddp(
    target: Any, inputs: Any, kwargs: Mapping[str, Any] | None, sharding: Sharding, model: Any, *, optimizer: str,
    budget: int | None, allow_offload: bool, device: str, trust: bool, main_module: str | None, autocast: str | None,
    dtype: str | None, model_class: str | None = None,
) -> RanksReport:
    """DDP's ranks: every rank alike, one traced (ddp_step.py); with `budget`, a checkpoint plan as for FSDP2."""
    if allow_offload:
        raise UsageError("--allow-offload is FSDP2's CPU offload, and under --ddp every rank keeps its whole model",
                         "leave --allow-offload out, or predict --fsdp")
    if device != "cpu":
        raise UsageError(
            f"--ddp is traced for --device cpu, not {device}: DDP's Reducer reduces in hooks that torch's autograd "
            "engine runs, and the engine runs no fake CUDA step without a GPU",
            "predict --device cpu (the same buckets), or --fsdp for a GPU")

    def measure(with_sharding: Sharding) -> Any:
        return trace_ddp_rank(target, inputs, kwargs, with_sharding, optimizer=optimizer, device=device, trust=trust,
                              main_module=main_module, autocast=autocast, dtype=dtype, model_class=model_class)

    traced = measure(sharding)
    report = RanksReport(
        target=traced.target, target_kind=traced.kind, model_class=traced.model_class, inputs=traced.inputs,
        device=device, loss=traced.loss, optimizer=optimizer, sharding=sharding, ranks=(traced.peak,), layouts=1,
        notes=traced.notes + tuple(f"torch warned while tracing: {message}" for message in traced.warnings[:3]),
        autocast=autocast, dtype=dtype, optimizer_state_dtype=traced.optimizer_state_dtype, ddp=traced.layout,
        class_chosen_by=traced.class_chosen_by,
    )
    if budget is None:
        return report
    plan, plan_notes = plan_ranks(
        report, budget, measure=lambda with_sharding: (measure(with_sharding).peak,),
        single_device=lambda: analyze(target, inputs, kwargs=kwargs, optimizer=optimizer, device=device, trust=trust,
                                      main_module=main_module, autocast=autocast, dtype=dtype,
                                      model_class=model_class),
        model=model, allow_offload=False,
    )
    return replace(report, plan=plan, notes=report.notes + plan_notes)
