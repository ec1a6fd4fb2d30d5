"""Each rank's training step under FSDP2 (and tensor parallel), predicted in one process.

One process plays one rank of N at a time: a fake process group (torch's own,
backend "fake") answers every collective at once with no other rank behind it,
and FakeTensorMode gives every tensor its shape, dtype and device but no memory.
torch's `FSDPMemTracker` (torch.distributed._tools.fsdp2_mem_tracker) does the
accounting, per rank and per kind (sharded and unsharded parameters, gradients,
optimizer state, activations, temporaries, all-gather and reduce-scatter
buffers), as it does on a real rank; run on fake tensors under the fake group it
gives the real rank's figure to the byte (measured: tests/activations/ranks/test_ranks_real.py).

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
from typing import Any, NamedTuple

from memlayout.activations.analysis import LIVE_MODULE, analyze
from memlayout.activations.device.expandable_segments import allocator_config
from memlayout.activations.device.gpus import requested_gpu
from memlayout.activations.model.build import build_model
from memlayout.activations.model.compiled import eager_model
from memlayout.activations.model.target import classify
from memlayout.activations.ranks.card import on_card, ranks_card
from memlayout.activations.ranks.ddp_step import trace_ddp_rank
from memlayout.activations.ranks.facts import RankLayout, RankPeak, RanksReport
from memlayout.activations.ranks.layouts import rank_layouts, rank_ranges, traced_layouts
from memlayout.activations.ranks.parallel import Sharding, resolve_sharding, sharding_options
from memlayout.activations.ranks.plan import plan_ranks
from memlayout.activations.ranks.rank_step import RankSettings, StepInputs, meta_copy, trace_rank
from memlayout.activations.ranks.serving_step import trace_serving_rank
from memlayout.activations.request.python_call import call_request
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.activations.step.generate import generation_of
from memlayout.activations.step.recipe import recipe_of, recipe_words
from memlayout.activations.step.run import LOSS_NONE, Autocast
from memlayout.activations.trace.world import device_for_gpu

# ----------------------------------------------------------------------------------------------
# The report


def _target_builder(request: StepRequest, chosen_by: dict[str, str]) -> tuple[Callable[[], Any], str | None, str]:
    """Builds the model on the meta device; each build records why it is of its class in `chosen_by["class"]`."""
    import torch

    target = request.target
    if isinstance(target, torch.nn.Module):
        chosen_by["class"] = LIVE_MODULE
        if not request.eager:
            eager_model(target, eager=False)  # a compiled model is refused before anything is copied
        return (lambda: eager_model(meta_copy(target), request.eager)), None, "module"
    kind = classify(str(target)).kind

    def build() -> Any:
        # On the meta device: FSDP2 and DTensor shard a model there, before it becomes fake (see above).
        built = build_model(request.model_target, context=lambda: torch.device("meta"), world="meta", device="meta",
                            adopt=meta_copy)
        chosen_by["class"] = built.class_chosen_by
        return eager_model(built.model, request.eager)

    return build, str(target), kind


def analyze_ranks(target: Any, inputs: Any = None, *, kwargs: Mapping[str, Any] | None = None,
                  **settings: Any) -> RanksReport:
    """Predict each rank's peak over a training step under FSDP2 (and tensor parallel) or DDP, in this process; or,
    for a step inference or generate, each rank's serving step under tensor parallel alone.

    Args:
        target: An nn.Module (copied to the meta device, never run) or a TARGET string, as for `analyze`.
        inputs: One rank's batch: tensors, spec strings or a `pkg.mod:make_inputs` spec, as for `analyze`.
        kwargs: Keyword inputs.
        settings: Any setting of `StepRequest` by name: `world_size` with `fsdp` (and `tp`, `fsdp_modules`,
            `param_dtype`, ...) or `ddp` (`bucket_cap_mb`, ...), or `sharding`, a `ShardingOptions`;
            `optimizer` (adamw by default); `budget`, the bytes each rank's peak must fit in, which adds a plan
            (`report.plan`) traced before it is returned, and `allow_offload`, which lets it offload to the CPU;
            `device`, `trust`, `main_module`, `model_class`, as for `analyze`; `autocast` (bf16 or fp16), which
            composes with FSDP2's `param_dtype`: that decides what the gathered parameters are before autocast
            casts what each op computes in; `dtype`, the model's floating parameters and buffers (and floating
            inputs) cast before tensor parallel and `fully_shard`, as the sharding code the report prints does;
            `step`, `new_tokens` and `cache` for serving ranks.

    Returns:
        A `RanksReport`: one `RankPeak` per distinct rank layout traced, the largest first.

    Raises:
        RanksBudgetUnreachableError: no plan fits `budget`; it carries the lowest plan found.
        SettingError: settings that do not go together.

    Example:
        >>> from memlayout.activations import analyze_ranks  # doctest: +SKIP
        >>> report = analyze_ranks("model.json", ["input_ids=int64[1,4096]<32000"], world_size=64, fsdp=True)
        >>> report.summary.peak_bytes  # the largest rank's
    """
    return predict_ranks(call_request(target, inputs, kwargs, Pipeline.RANKS, settings))


def predict_ranks(request: StepRequest) -> RanksReport:
    """Each rank of the request's `world_size` (see `analyze_ranks`)."""
    gpu = requested_gpu(request.gpu, request.gpu_memory)
    if gpu is not None:  # `gpu` (or `gpu_memory`) traces for CUDA, as one device's step does
        request = replace(request, device=device_for_gpu(request.device, "fake", gpu))
    chosen_by: dict[str, str] = {}
    build, target_text, kind = _target_builder(request, chosen_by)
    model = build()
    sharding = resolve_sharding(model, sharding_options(request))
    if request.serving:
        del model
        return _analyze_serving(request, build, sharding, target_text, kind, chosen_by)
    if sharding.ddp is not None:
        return _analyze_ddp(request, sharding, model)
    return _analyze_fsdp(request, build, model, sharding, Described(target_text, kind, chosen_by))


class Described(NamedTuple):
    """What a report says of the target: as given (None for a module), its kind, and why its class."""

    target: str | None
    kind: str
    chosen_by: dict[str, str]


def _analyze_fsdp(request: StepRequest, build: Callable[[], Any], model: Any, resolved: Sharding,
                  target: Described) -> RanksReport:
    """FSDP2 (and tensor parallel): one rank of each layout traced; with a budget, a plan for the largest rank."""
    layouts = rank_layouts(model, resolved)
    built_class = type(model).__name__
    del model
    traced = traced_layouts(layouts)
    measured = _FsdpRanks(request, build)
    peaks = measured(resolved, traced)
    notes = list(resolved.notes) + [f"torch warned while tracing: {message}" for message in list(measured.warned)[:3]]
    if len(layouts) > len(peaks):
        notes.append(
            f"the ranks' shards come in {len(layouts)} different shapes; {len(peaks)} were traced, the largest shards "
            "(rank 0) among them"
        )
    report = RanksReport(
        target=target.target, target_kind=target.kind, model_class=built_class, inputs=measured.described["inputs"],
        device=request.device, loss=measured.described["loss"], optimizer=request.step_optimizer, sharding=resolved,
        ranks=peaks, layouts=len(layouts), notes=tuple(notes), autocast=request.autocast, dtype=request.dtype,
        optimizer_state_dtype=measured.described["state_dtype"], class_chosen_by=target.chosen_by["class"],
        card=measured.card, recipe=recipe_words(request),
    )
    if request.budget is None:
        return report
    # Plans are searched on the largest rank alone (rank 0 holds the largest shards, and the
    # ranks' steps differ only by their shards); the plan found is then traced on every layout.
    plan = plan_ranks(
        report, ranks_budget_bytes(request), measure=lambda s: measured(s, traced[:1]),
        single_device=lambda: _single_device(request), model=build(), allow_offload=request.allow_offload,
    )
    if len(traced) > 1 and not plan.empty:
        plan = replace(plan, ranks=measured(plan.sharding, traced))
    return replace(report, plan=plan)


class _FsdpRanks:
    """Traces FSDP2's ranks, one of each layout asked for, and keeps what the traces said besides their peaks."""

    def __init__(self, request: StepRequest, build: Callable[[], Any]) -> None:
        self.build = build
        self.inputs = StepInputs(request.step_inputs, request.kwargs)
        self.card = ranks_card(request)
        self.settings = RankSettings(
            optimizer=request.step_optimizer, device=request.device,
            autocast=Autocast("cuda" if request.device.startswith("cuda") else "cpu", request.autocast)
            if request.autocast is not None else None,
            allocator=allocator_config() if self.card is not None else None, recipe=recipe_of(request),
            gpu=self.card.gpu if self.card is not None else None,
        )
        self.described: dict[str, Any] = {}
        self.warned: dict[str, None] = {}

    def __call__(self, sharding: Sharding, which: Sequence[RankLayout]) -> tuple[RankPeak, ...]:
        peaks = []
        for layout in which:
            traced = trace_rank(self.build, sharding, layout.ranks[0], rank_ranges(layout.ranks), self.inputs,
                                self.settings)
            self.described["inputs"], self.described["loss"] = traced.inputs, traced.loss
            self.described["state_dtype"] = traced.optimizer_state_dtype
            self.warned.update(dict.fromkeys(traced.warnings))
            peaks.append(on_card(traced.peak, self.card))
        return tuple(peaks)


def ranks_budget_bytes(request: StepRequest) -> int:
    """Bytes per rank: the budget's size, or its share of the card's memory (request/rules.py: only with `gpu`)."""
    assert request.budget is not None
    if request.budget.bytes is not None:
        return request.budget.bytes
    card = ranks_card(request)
    assert card is not None and request.budget.fraction is not None
    return int(card.gpu.total_memory * request.budget.fraction)


def _single_device(request: StepRequest) -> Any:
    """The same step on one device, unsharded: what the plan's first candidates are read off."""
    settings = {name: getattr(request, name) for name in ("optimizer", "device", "trust", "main_module", "autocast",
                                                           "dtype", "model_class", "optimizer_impl", "clip_grad_norm",
                                                           "clip_grad_impl", "selective_ac", "ac_modules", "gpu",
                                                           "gpu_memory")}
    return analyze(request.target, request.step_inputs, kwargs=request.kwargs, **settings)


def _analyze_serving(request: StepRequest, build: Callable[[], Any], sharding: Sharding, target_text: str | None,
                     kind: str, chosen_by: dict[str, str]) -> RanksReport:
    """Tensor-parallel serving: every rank alike, rank 0 traced (serving_step.py)."""
    traced = trace_serving_rank(build, sharding, StepInputs(request.step_inputs, request.kwargs),
                                device=request.device, generation=generation_of(request))
    notes = list(sharding.notes) + [f"torch warned while tracing: {message}" for message in traced.warnings[:3]]
    return RanksReport(
        target=target_text, target_kind=kind, model_class=traced.model_class, inputs=traced.inputs,
        device=request.device, loss=LOSS_NONE, optimizer="none", sharding=sharding, ranks=(traced.peak,), layouts=1,
        notes=tuple(notes), dtype=request.dtype, class_chosen_by=chosen_by["class"], step=request.step,
    )


def _analyze_ddp(request: StepRequest, sharding: Sharding, model: Any) -> RanksReport:
    """DDP's ranks: every rank alike, one traced (ddp_step.py); with a budget, a checkpoint plan as for FSDP2."""
    traced = trace_ddp_rank(request, sharding)
    report = RanksReport(
        target=traced.target, target_kind=traced.kind, model_class=traced.model_class, inputs=traced.inputs,
        device=request.device, loss=traced.loss, optimizer=request.step_optimizer, sharding=sharding,
        ranks=(traced.peak,), layouts=1,
        notes=traced.notes + tuple(f"torch warned while tracing: {message}" for message in traced.warnings[:3]),
        autocast=request.autocast, dtype=request.dtype, optimizer_state_dtype=traced.optimizer_state_dtype,
        ddp=traced.layout, class_chosen_by=traced.class_chosen_by,
    )
    if request.budget is None:
        return report
    plan = plan_ranks(
        report, ranks_budget_bytes(request),
        measure=lambda with_sharding: (trace_ddp_rank(request, with_sharding).peak,),
        single_device=lambda: _single_device(request), model=model, allow_offload=False,
    )
    return replace(report, plan=plan)
