"""Activation memory of one training step, and checkpoint plans that fit a budget.

`analyze(target, inputs, budget=...)` traces a step (on fake tensors by default)
and returns an `ActivationReport`; `apply_plan(model, report.plan.plan)` applies
its plan to a live model. Data flows one way: trace (fake, meta or real tensors)
-> frozen facts per module and phase -> plan (a pure function of the facts and the
budget, checked by tracing again) -> report. torch is imported only when a
function needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout.activations.sizes import parse_size

if TYPE_CHECKING:
    from memlayout.activations.analysis import (
        ActivationReport,
        BudgetUnreachableError,
        PlanResult,
        analyze,
    )
    from memlayout.activations.apply import AppliedPlan, apply_plan
    from memlayout.activations.plan import Plan, SequentialSegments

_LAZY = {
    "analyze": "memlayout.activations.analysis",
    "ActivationReport": "memlayout.activations.analysis",
    "BudgetUnreachableError": "memlayout.activations.analysis",
    "PlanResult": "memlayout.activations.analysis",
    "apply_plan": "memlayout.activations.apply",
    "AppliedPlan": "memlayout.activations.apply",
    "Plan": "memlayout.activations.plan",
    "SequentialSegments": "memlayout.activations.plan",
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
    "Plan",
    "PlanResult",
    "SequentialSegments",
    "analyze",
    "apply_plan",
    "parse_size",
]
