"""`--fit`'s probes: the step traced at one size, plain or through the budget search, on one device or per rank.

size_search.py searches over sizes; a probe is what one size costs: re-make the `--input`
specs at that size (`specs_at`) and trace the step again on the model built once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from memlayout.activations.analysis import ActivationReport, target_gpu
from memlayout.activations.budget import Budget, card_budget, resolve_budget
from memlayout.activations.fit.sized_step import ScaledDim, SizedStep, specs_at
from memlayout.activations.model.input_specs import InputSpec
from memlayout.activations.ranks import predict_ranks, ranks_budget_bytes
from memlayout.activations.ranks.card import ranks_card
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.activations.search import (
    PlanResult,
    TraceFailure,
    lowest_plan_summary,
    plan_for_budget,
)
from memlayout.activations.sizes import BudgetSpec
from memlayout.activations.step.generate import generation_of
from memlayout.activations.summary import module_facts
from memlayout.errors import (
    BudgetUnreachableError,
    RanksBudgetUnreachableError,
    SettingError,
    UsageError,
)

if TYPE_CHECKING:
    from memlayout.activations.facts import Trace
    from memlayout.activations.plans.plan import Plan
    from memlayout.activations.ranks.facts import RanksPlan
    from memlayout.activations.summary import Summary

__all__ = ["DeviceProbe", "FitProbe", "Probe", "RanksProbe", "ScaledDim", "TracedFloor", "specs_at"]


@dataclass(frozen=True)
class FitProbe:
    """One traced size."""

    size: int
    with_plan: bool
    """Traced through the budget search (the `--budget` search at this size), not the plain step."""
    peak_bytes: int | None
    """The peak of live tensors (with a plan: of the plan the search found, or the lowest it reached); None when
    the step failed."""
    fits: bool
    failure: str | None = None
    """Why the step failed at this size, in one line; None when it ran."""
    compared_bytes: int | None = None
    """The figure compared with the budget (on CUDA the reserved peak plus the CUDA runtime); None: the peak."""
    estimated_guide_bytes: int | None = None
    """With a plan found: the planner's estimate of its lowest plan's figure at this size (see `guide`)."""
    checks: int = 0
    """With a plan: the plans the budget search traced at this size."""
    cut_short: str | None = None
    """With a plan: where the budget search stopped at a limit of its own (see search.PlanResult)."""
    evaluated: bool = False
    """The plain step's figures here were evaluated from its traces at other sizes (size_laws.py), not traced."""

    @property
    def judged_bytes(self) -> int | None:
        return self.peak_bytes if self.compared_bytes is None else self.compared_bytes

    @property
    def guide(self) -> int | None:
        """What the size search interpolates on, a figure that grows nearly in a line with the size; None:
        nothing. Where no plan fits, the budget search's lowest figure: the floor a planned step grows along
        (Llama-7B at 4,096 tokens on an H100: 88.0 GB at batch 13, 127.7 GB at 24, nearly on the line from its
        state at 0). A plan the search found sits just under the budget at every size, so what stands in for its
        floor there is the planner's estimate of its lowest plan (`estimated_guide_bytes`)."""
        return self.judged_bytes if self.guide_measured else self.estimated_guide_bytes

    @property
    def guide_measured(self) -> bool:
        """Whether `guide` was traced, not estimated: the search draws its line between traced figures once it
        has one above the budget (the planner's estimate of Llama-7B's floor grows at a third of the traced
        floor's rate, and steered by it the search probed 37 for an answer of 12)."""
        return not (self.with_plan and self.fits)


class TracedFloor(NamedTuple):
    """The planner's lowest plan traced at one size, which aimed `--fit`'s first size through the budget search."""

    size: int
    compared_bytes: int
    """Its figure compared with the budget (on CUDA the reserved peak plus the CUDA runtime)."""
    plan: Plan


class Probe:
    """Traces the step at one size: the plain step, or through the budget search."""

    budget: Budget
    """What each size must fit in, and the figure compared with it."""
    optimizer: str
    """The optimizer the step runs: whose state is part of the model's own."""
    request: StepRequest
    specs: list[InputSpec]
    """The `input` specs as given, which each size re-makes (`specs_at`)."""
    dims: tuple[ScaledDim, ...]

    def plain(self, size: int) -> FitProbe:
        raise NotImplementedError

    def planned(self, size: int, prune: bool = False) -> FitProbe:
        raise NotImplementedError

    def plan_at(self, size: int) -> PlanResult | RanksPlan | None:
        raise NotImplementedError

    def floor(self, size: int) -> TracedFloor | None:
        """The planner's lowest plan at this size, traced; None where it is not traced."""
        del size
        return None

    def state_bytes(self) -> int:
        raise NotImplementedError

    def report_at(self, size: int) -> ActivationReport | RanksReport:
        raise NotImplementedError

    def position_limit(self) -> tuple[str, int] | None:
        raise NotImplementedError


class DeviceProbe(Probe):
    """One device: the model built once (`SizedStep`), each size a trace of the same model, or the plain step
    evaluated from its traces at other sizes where their laws cover the size (size_laws.py).

    Args:
        sized: The step already built at these specs (a sweep's), to trace at the sizes the search asks for.
    """

    def __init__(self, request: StepRequest, specs: list[InputSpec], dims: tuple[ScaledDim, ...],
                 sized: SizedStep | None = None) -> None:
        self.request, self.specs, self.dims = request, specs, dims
        self.optimizer = request.step_optimizer
        self.generation = generation_of(request)
        self.sized = SizedStep(request, specs, dims) if sized is None else sized
        self.step = self.sized.step
        self.notes, self.target_text = self.sized.prepared.notes, self.sized.prepared.target_text
        self.kind, self.class_chosen_by = self.sized.prepared.kind, self.sized.prepared.class_chosen_by
        self.cuda = self.sized.cuda
        self.budget = self._budget(request.budget)
        self.searched: dict[int, PlanResult] = {}
        """size -> the budget search's plan there (found, or the lowest it reached)."""
        self.plans_traced: dict[int, dict[Plan, Summary | TraceFailure]] = {}
        """size -> the plans the budget search traced there, kept for the search at the answer (`plan_at`)."""
        self.pruned: set[int] = set()
        """The sizes whose search in `searched` ran to the end, its plan pruned (`plan_at`)."""

    def _budget(self, spec: BudgetSpec | None) -> Budget:
        gpu = target_gpu(self.step)
        if spec is None:
            if not self.cuda or gpu is None:
                raise SettingError("`fit` needs a budget: give `budget=SIZE`, or `gpu=NAME` for that GPU's memory",
                                   "e.g. `gpu=h100`, or `budget=78GiB`")
            return card_budget(gpu)
        budget = resolve_budget(spec, cuda=self.cuda, gpu=gpu)
        assert budget is not None
        return budget

    def _trace(self, size: int) -> tuple[Trace, Summary]:
        return self.sized.trace(size)

    def plain(self, size: int) -> FitProbe:
        known = self.sized.traced_summary(size)
        if known is not None:
            compared = self.budget.judged(known) if self.cuda else None
            return FitProbe(size, False, known.peak_bytes, self.budget.fits(known), compared_bytes=compared)
        evaluated = self.sized.evaluated(size)
        if evaluated is not None:
            compared = self.budget.judged(evaluated) if self.cuda else None
            return FitProbe(size, False, evaluated.peak_bytes, self.budget.fits(evaluated), compared_bytes=compared,
                            evaluated=True)
        try:
            _, summary = self._trace(size)
        except UsageError as exc:
            if size == self.specs_size():
                raise
            return FitProbe(size, False, None, False, exc.one_line())
        compared = self.budget.judged(summary) if self.cuda else None
        return FitProbe(size, False, summary.peak_bytes, self.budget.fits(summary), compared_bytes=compared)

    def specs_size(self) -> int:
        return self.sized.given_size

    def planned(self, size: int, prune: bool = False) -> FitProbe:
        """The `--budget` search at this size, as `analyze(..., budget=...)` runs it: the size fits with a plan
        exactly when that search finds one, so `--fit` and `--budget` cannot disagree.

        A probe asks only whether a plan fits, which the search decides before it prunes the plan
        it found; `plan_at` runs the last stage at the answer, from the plans traced here."""
        try:
            trace, summary = self._trace(size)
            found = plan_for_budget(self.step, trace, summary, module_facts(trace), self.budget, prune=prune,
                                    traced=self.plans_traced.setdefault(size, {}))
        except BudgetUnreachableError as exc:
            lowest: PlanResult = exc.lowest
            self.searched[size] = lowest
            return FitProbe(size, True, lowest.peak_bytes, False, compared_bytes=lowest.compared_bytes,
                            checks=lowest.checks, cut_short=lowest.cut_short)
        except UsageError as exc:
            return FitProbe(size, True, None, False, exc.one_line())
        self.searched[size] = found
        return FitProbe(size, True, found.peak_bytes, True, compared_bytes=found.compared_bytes,
                        estimated_guide_bytes=found.lowest_estimate_bytes, checks=found.checks,
                        cut_short=found.cut_short)

    def floor(self, size: int) -> TracedFloor | None:
        """The planner's lowest plan at this size (search.lowest_plan_summary), traced into the memo the budget
        search at this size reads; None where that plan is empty or its step fails."""
        try:
            trace, _ = self._trace(size)
        except UsageError:
            return None
        lowest = lowest_plan_summary(self.step, trace, module_facts(trace), self.plans_traced.setdefault(size, {}))
        return None if lowest is None else TracedFloor(size, self.budget.judged(lowest[1]), lowest[0])

    def plan_at(self, size: int) -> PlanResult | None:
        """The budget search's plan at this size, as `--budget` finds it: the cheapest that fits, pruned, or the
        lowest it reached."""
        if size not in self.pruned:
            self.planned(size, prune=True)
            self.pruned.add(size)
        return self.searched.get(size)

    def state_bytes(self) -> int:
        _, summary = self._trace(self.specs_size())
        return int(summary.parameter_bytes + summary.buffer_bytes + summary.optimizer_bytes)

    def report_at(self, size: int) -> ActivationReport:
        return self.sized.report(size)

    def position_limit(self) -> tuple[str, int] | None:
        return self.sized.position_limit()


class RanksProbe(Probe):
    """Ranks: each size predicted by `analyze_ranks` (it builds the sharded model afresh)."""

    def __init__(self, request: StepRequest, specs: list[InputSpec], dims: tuple[ScaledDim, ...]) -> None:
        assert request.budget is not None  # request/rules.py: a size, or a share of the named GPU's memory
        # Each rank's judged figure is compared: on CUDA its reserved peak and the runtime beside it (ranks/card.py).
        card = ranks_card(request)
        self.budget = Budget(ranks_budget_bytes(request), f"--budget {request.budget.describe()}",
                             card.runtime.beside_step_bytes if card is not None else None)
        self.request, self.specs, self.dims = request, specs, dims
        self.optimizer = request.step_optimizer
        self.reports: dict[int, RanksReport] = {}
        self.plans: dict[int, RanksPlan] = {}

    def _ranks(self, size: int, budget: int | None) -> RanksReport:
        """The ranks at this size, with a plan for `budget` (None: the plain step)."""
        inputs = tuple(specs_at(self.specs, self.dims, size))
        spec = None if budget is None else BudgetSpec(bytes=budget)
        return predict_ranks(replace(self.request, input=inputs, fit=None, budget=spec, pipeline=Pipeline.RANKS))

    def _report(self, size: int) -> RanksReport:
        if size not in self.reports:
            self.reports[size] = self._ranks(size, None)
        return self.reports[size]

    def plain(self, size: int) -> FitProbe:
        try:
            peak = self._report(size).largest.judged_bytes
        except UsageError as exc:
            if size == self._given():
                raise
            return FitProbe(size, False, None, False, exc.one_line())
        return FitProbe(size, False, peak, peak <= self.budget.bytes)

    def _given(self) -> int:
        return self.specs[[s.describe() for s in self.specs].index(self.dims[0].input)].shape[self.dims[0].dim]

    def planned(self, size: int, prune: bool = False) -> FitProbe:
        del prune  # analyze_ranks runs its whole search, pruning included, at every size
        try:
            report = self._ranks(size, self.budget.bytes)
        except RanksBudgetUnreachableError as exc:
            return FitProbe(size, True, exc.lowest.judged_bytes, False)
        except UsageError as exc:
            return FitProbe(size, True, None, False, exc.one_line())
        assert report.plan is not None
        self.plans[size] = report.plan
        return FitProbe(size, True, report.plan.judged_bytes, True)

    def plan_at(self, size: int) -> RanksPlan | None:
        if size not in self.plans:
            self.planned(size)
        return self.plans.get(size)

    def state_bytes(self) -> int:
        rank = self._report(self._given()).largest
        return int(rank.parameter_bytes + rank.buffer_bytes + rank.optimizer_bytes)

    def report_at(self, size: int) -> RanksReport:
        return self._report(size)

    def position_limit(self) -> tuple[str, int] | None:
        return None
