"""`--fit`'s probes: the step traced at one size, plain or through the budget search, on one device or per rank.

size_search.py searches over sizes; a probe is what one size costs: re-make the `--input`
specs at that size (`specs_at`) and trace the step again on the model built once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from memlayout.activations.analysis import ActivationReport, _step_failed, prepare_step
from memlayout.activations.generate_summary import summarize_generation
from memlayout.activations.model.input_specs import InputSpec, position_limit
from memlayout.activations.plans.plan import Planner
from memlayout.activations.ranks import analyze_ranks
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.search import PlanResult, exclusions, pitfalls, plan_for_budget
from memlayout.activations.step.run import torch_dtype
from memlayout.activations.summary import module_facts, summarize
from memlayout.errors import (
    BudgetUnreachableError,
    MemlayoutError,
    RanksBudgetUnreachableError,
    UsageError,
)

if TYPE_CHECKING:
    from memlayout.activations.plans.plan import Plan
    from memlayout.activations.ranks.facts import RanksPlan
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.activations.step.generate import Generation

KEPT_TRACES = 3
"""Traces of the plain step kept for the plan search and the report; older ones are traced again if needed."""


class ScaledDim(NamedTuple):
    """One input dimension the search scales."""

    input: str
    """The input's spec as given (`input_ids=int64[4,128]<32000`)."""
    dim: int


@dataclass(frozen=True)
class FitProbe:
    """One traced size."""

    size: int
    with_plan: bool
    """Traced through the budget search (the plan's peak), not the plain step."""
    peak_bytes: int | None
    """The peak (with a plan: the lowest the budget search reached); None when the step failed."""
    fits: bool
    failure: str | None = None
    """Why the step failed at this size, in one line; None when it ran."""


def specs_at(specs: Sequence[InputSpec], dims: Sequence[ScaledDim], size: int) -> list[InputSpec]:
    """The specs with every scaled dimension set to `size`."""
    by_input = {d.input: d.dim for d in dims}
    out = []
    for spec in specs:
        dim = by_input.get(spec.describe())
        if dim is not None:
            shape = list(spec.shape)
            shape[dim] = size
            spec = dataclasses.replace(spec, shape=tuple(shape))
        out.append(spec)
    return out


class Probe:
    """Traces the step at one size: the plain step, or through the budget search."""

    def plain(self, size: int) -> FitProbe:
        raise NotImplementedError

    def planned(self, size: int) -> FitProbe:
        raise NotImplementedError

    def plan_at(self, size: int) -> PlanResult | RanksPlan | None:
        raise NotImplementedError

    def state_bytes(self) -> int:
        raise NotImplementedError

    def report_at(self, size: int) -> ActivationReport | RanksReport:
        raise NotImplementedError

    def position_limit(self) -> tuple[str, int] | None:
        raise NotImplementedError


class DeviceProbe(Probe):
    """One device: the model built once (`prepare_step`), each size a trace of the same model."""

    def __init__(self, target: Any, specs: list[InputSpec], dims: tuple[ScaledDim, ...], *, budget: int, device: str,
                 optimizer: str, autocast: str | None, dtype: str | None, step_kind: str, trust: bool,
                 main_module: str | None, gpu: str | None = None, generation: Generation | None = None) -> None:
        self.specs, self.dims, self.budget = specs, dims, budget
        self.optimizer, self.autocast, self.dtype, self.step_kind = optimizer, autocast, dtype, step_kind
        self.generation = generation
        self.step, self.notes, self.target_text, self.kind = prepare_step(
            target, specs, kwargs=None, device=device, mode="meta" if device == "meta" else "fake", trust=trust,
            optimizer=optimizer, autocast=autocast, dtype=dtype, main_module=main_module, gpu=gpu,
            step_kind=step_kind, generation=generation,
        )
        self.cuda = self.step.device.startswith("cuda")
        self.size: int | None = None
        self.traced: dict[int, Any] = {}
        """size -> (trace, summary) of the plain step, for the report and the plan search."""
        self.lowest_plan: Plan | None = None

    def _at(self, size: int) -> None:
        if self.size == size:
            return
        self.step.make_inputs(specs_at(self.specs, self.dims, size), None)
        if self.dtype is not None:
            self.step.cast_inputs(torch_dtype(self.dtype))
        self.size = size

    def _trace(self, size: int) -> Any:
        self._at(size)
        if size not in self.traced:
            try:
                trace = self.step.trace()
            except MemlayoutError:
                raise
            except Exception as exc:  # the model's forward refused this size
                raise _step_failed(exc, self.step) from exc
            self.traced[size] = (trace, summarize(trace, cuda=self.cuda))
            while len(self.traced) > KEPT_TRACES:  # a 7B model's trace is tens of MB of records
                del self.traced[next(iter(self.traced))]
        return self.traced[size]

    def plain(self, size: int) -> FitProbe:
        try:
            _, summary = self._trace(size)
        except UsageError as exc:
            if size == self.specs_size():
                raise
            return FitProbe(size, False, None, False, exc.one_line())
        return FitProbe(size, False, summary.peak_bytes, summary.peak_bytes <= self.budget)

    def specs_size(self) -> int:
        return self.specs[[s.describe() for s in self.specs].index(self.dims[0].input)].shape[self.dims[0].dim]

    def planned(self, size: int) -> FitProbe:
        """The step with the lowest plan: what a size needs to fit with some plan. One trace a size.

        Running the whole budget search at every size would trace up to a dozen plans each;
        the plan that reaches the lowest peak is chosen once, at the first size probed (above
        the plain answer, where the plain step does not fit), and the search's own plan is
        found at the answer only (`plan_at`).
        """
        if self.lowest_plan is None:
            try:
                trace, summary = self._trace(size)
            except UsageError as exc:
                return FitProbe(size, True, None, False, exc.one_line())
            if summary.peak_bytes <= self.budget:
                return FitProbe(size, True, summary.peak_bytes, True)
            chosen = self._lowest_plan(trace)
            if chosen is None:
                return FitProbe(size, True, summary.peak_bytes, False)
            self.lowest_plan, peak = chosen
            return FitProbe(size, True, peak, peak <= self.budget)
        self._at(size)
        try:
            peak = summarize(self.step.trace(self.lowest_plan), cuda=self.cuda).peak_bytes
        except Exception as exc:  # the plan's step failed at this size
            return FitProbe(size, True, None, False, f"with the lowest plan, {type(exc).__name__}: {exc}")
        return FitProbe(size, True, peak, peak <= self.budget)

    def _lowest_plan(self, trace: Any) -> tuple[Plan, int] | None:
        """Of the planner's lowest plan and its every-module-of-a-level plans, the one whose traced peak is lowest.

        They are traced in the order of the planner's estimates, and the rest are left untraced
        once an estimate is no lower than the lowest peak traced so far. On Llama-7B at 4k tokens
        (bench_fit.py's model) the three candidates' estimates were within 0.34% of their traced
        peaks, the lowest exact, and two traces of the three were saved; where estimates run high
        (a 2-layer Llama's, by 3-4%), a candidate estimated above a traced peak could be lower
        by a few %, and the plan the answer reports is the budget search's, traced, in any case.
        """
        planner = Planner(trace, exclusions(module_facts(trace), trace, self.step.initial_modules))
        candidates: dict[Plan, int] = {}
        for chosen in [planner.lowest(), *planner.covers()]:
            plan = planner.plan_of(chosen)
            if not plan.empty:  # the lowest plan can be a whole level's: one trace is enough
                candidates.setdefault(plan, planner.estimate(chosen))
        best: tuple[Plan, int] | None = None
        for plan, estimate in sorted(candidates.items(), key=lambda item: item[1]):
            if best is not None and estimate >= best[1]:
                break
            try:
                traced = self.step.trace(plan)
            except Exception:  # a plan whose step fails is not a candidate (the budget search says why)
                continue
            if traced.rerun_state_differs:
                continue
            peak = summarize(traced, cuda=self.cuda).peak_bytes
            if best is None or peak < best[1]:
                best = (plan, peak)
        return best

    def plan_at(self, size: int) -> PlanResult | None:
        """The budget search's plan at this size (the cheapest it finds that fits); the lowest plan if it finds none."""
        trace, summary = self._trace(size)
        modules = module_facts(trace)
        try:
            return plan_for_budget(self.step, trace, summary, modules, self.budget)
        except BudgetUnreachableError:
            if self.lowest_plan is None:
                return None
            traced = summarize(self.step.trace(self.lowest_plan), cuda=self.cuda)
            return PlanResult(self.budget, self.lowest_plan, traced.peak_bytes, traced.allocator_peak_bytes,
                              traced.peak_bytes, traced.recompute_flops, 1,
                              pitfalls(self.lowest_plan, modules, self.step.model))

    def state_bytes(self) -> int:
        _, summary = self._trace(self.specs_size())
        return int(summary.parameter_bytes + summary.buffer_bytes + summary.optimizer_bytes)

    def report_at(self, size: int) -> ActivationReport:
        trace, summary = self._trace(size)
        step = self.step
        return ActivationReport(
            target=self.target_text, target_kind=self.kind, model_class=type(step.model).__name__,
            inputs=step.descriptions, device=step.device, mode=step.mode, loss=trace.loss, optimizer=self.optimizer,
            summary=summary, modules=module_facts(trace), plan=None, notes=tuple(self.notes), trace=trace,
            autocast=self.autocast, dtype=self.dtype, step=self.step_kind,
            generation=summarize_generation(trace, self.generation) if self.generation is not None else None,
        )

    def position_limit(self) -> tuple[str, int] | None:
        limit = position_limit(self.step.model)
        if limit is None or self.generation is None:
            return limit
        # The prompt and the tokens generated after it share the model's positions.
        name, positions = limit
        return f"{name} less --new-tokens {self.generation.new_tokens}", positions - self.generation.new_tokens


class RanksProbe(Probe):
    """Ranks: each size predicted by `analyze_ranks` (it builds the sharded model afresh)."""

    def __init__(self, target: Any, specs: list[InputSpec], dims: tuple[ScaledDim, ...], *, sharding: ShardingOptions,
                 optimizer: str, budget: int, device: str, trust: bool, main_module: str | None) -> None:
        self.target, self.specs, self.dims, self.budget = target, specs, dims, budget
        self.options: dict[str, Any] = {"sharding": sharding, "optimizer": optimizer, "device": device, "trust": trust,
                        "main_module": main_module}
        self.reports: dict[int, RanksReport] = {}
        self.plans: dict[int, RanksPlan] = {}

    def _report(self, size: int) -> RanksReport:
        if size not in self.reports:
            self.reports[size] = analyze_ranks(self.target, specs_at(self.specs, self.dims, size), **self.options)
        return self.reports[size]

    def plain(self, size: int) -> FitProbe:
        try:
            peak = self._report(size).largest.peak_bytes
        except UsageError as exc:
            if size == self._given():
                raise
            return FitProbe(size, False, None, False, exc.one_line())
        return FitProbe(size, False, peak, peak <= self.budget)

    def _given(self) -> int:
        return self.specs[[s.describe() for s in self.specs].index(self.dims[0].input)].shape[self.dims[0].dim]

    def planned(self, size: int) -> FitProbe:
        try:
            report = analyze_ranks(self.target, specs_at(self.specs, self.dims, size), budget=self.budget,
                                   **self.options)
        except RanksBudgetUnreachableError as exc:
            return FitProbe(size, True, exc.lowest.peak_bytes, False)
        except UsageError as exc:
            return FitProbe(size, True, None, False, exc.one_line())
        assert report.plan is not None
        self.plans[size] = report.plan
        return FitProbe(size, True, report.plan.peak_bytes, True)

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
