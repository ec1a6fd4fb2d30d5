"""Activation memory of one training step, and checkpoint plans that fit a budget.

`analyze(target, inputs, budget=...)` traces a step (on fake tensors by default)
and returns an `ActivationReport`; `apply_plan(model, report.plan.plan)` applies
its plan to a live model. Data flows one way: trace (fake, meta or real tensors)
-> frozen facts per module and phase -> plan (a pure function of the facts and the
budget, checked by tracing again) -> report. torch is imported only when a
function needs it.

`analyze_ranks(target, inputs, sharding=ShardingOptions(world_size=N))` predicts
each rank's peak under FSDP2 (and tensor parallel) on fake ranks, and a plan for
a budget per rank.

`predict(StepRequest(...))` answers whatever a request asks (request/step_request.py): the
settings of `memlayout activations` in one frozen object, checked once; each function above
takes the same settings by name.

`allocator_peaks(report.trace)` replays a traced step through a model of the CUDA
caching allocator: what `max_memory_allocated()` and `max_memory_reserved()` would read;
`memory_snapshot(report.trace)` is that replay as `torch.cuda.memory._snapshot()`'s dict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout.activations.sizes import parse_size

if TYPE_CHECKING:
    from memlayout.activations.analysis import ActivationReport, analyze
    from memlayout.activations.device.allocator_replay import allocator_peaks
    from memlayout.activations.device.memory_snapshot import memory_snapshot
    from memlayout.activations.fit.sweep import SweepReport
    from memlayout.activations.pipelines import predict
    from memlayout.activations.plans.apply import AppliedPlan, apply_plan
    from memlayout.activations.plans.plan import Plan, Segment, SequentialSegments
    from memlayout.activations.ranks import analyze_ranks
    from memlayout.activations.ranks.facts import RanksReport
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.activations.request.step_request import StepRequest
    from memlayout.activations.request.vocabulary import Pipeline
    from memlayout.activations.search import PlanResult
    from memlayout.errors import BudgetUnreachableError, SettingError

_LAZY = {
    "analyze": "memlayout.activations.analysis",
    "ActivationReport": "memlayout.activations.analysis",
    "BudgetUnreachableError": "memlayout.errors",
    "SettingError": "memlayout.errors",
    "StepRequest": "memlayout.activations.request.step_request",
    "Pipeline": "memlayout.activations.request.vocabulary",
    "predict": "memlayout.activations.pipelines",
    "PlanResult": "memlayout.activations.search",
    "apply_plan": "memlayout.activations.plans.apply",
    "AppliedPlan": "memlayout.activations.plans.apply",
    "Plan": "memlayout.activations.plans.plan",
    "SequentialSegments": "memlayout.activations.plans.plan",
    "Segment": "memlayout.activations.plans.plan",
    "analyze_ranks": "memlayout.activations.ranks",
    "ShardingOptions": "memlayout.activations.ranks.parallel",
    "RanksReport": "memlayout.activations.ranks.facts",
    "allocator_peaks": "memlayout.activations.device.allocator_replay",
    "memory_snapshot": "memlayout.activations.device.memory_snapshot",
    "SweepReport": "memlayout.activations.fit.sweep",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memlayout.activations' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ActivationReport",
    "AppliedPlan",
    "BudgetUnreachableError",
    "Pipeline",
    "Plan",
    "PlanResult",
    "RanksReport",
    "Segment",
    "SequentialSegments",
    "SettingError",
    "ShardingOptions",
    "StepRequest",
    "SweepReport",
    "allocator_peaks",
    "analyze",
    "analyze_ranks",
    "apply_plan",
    "memory_snapshot",
    "parse_size",
    "predict",
]
