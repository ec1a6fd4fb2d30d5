"""The search for a checkpoint plan that fits a budget, each candidate checked by tracing it again.

The planner (plans/plan.py) estimates; this module traces its candidates in the step's world,
excludes the modules whose rerun fails or is no replay, and names the pitfalls that apply
to the plan found (plans/pitfalls.py). analysis.py calls `plan_for_budget`; the ranks' search
(ranks/plan.py) shares `exclusions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from memlayout.activations.budget import Budget
from memlayout.activations.facts import Trace
from memlayout.activations.plans.pitfalls import checkpointed_paths, pitfalls
from memlayout.activations.plans.plan import Plan, Planner
from memlayout.activations.summary import ModuleFacts, Summary, summarize
from memlayout.activations.trace.world import StepWorld
from memlayout.errors import BudgetUnreachableError, MemlayoutError, UsageError

MAX_CHECKS = 6
"""Plans traced again at most per budget, before falling back to the lowest plan."""
PRUNE_CHECKS = 16
"""At most this many more traces to drop what a plan found by tracing does not need."""
PRUNE_ROOM = 2
"""A module is kept without tracing the plan without it when the planner prices its drop at more than this many
times the room the traced plan leaves under the budget (Llama-7B's block drops, traced, came to 0.95 to 1.29
times the planner's price)."""


@dataclass(frozen=True)
class PlanResult:
    """A plan for a budget, and what tracing it again measured."""

    budget_bytes: int
    plan: Plan
    peak_bytes: int
    """The peak of a trace with the plan applied."""
    allocator_peak_bytes: int | None
    estimated_peak_bytes: int
    """The planner's estimate before that trace."""
    recompute_flops: int
    """Forward FLOPs rerun during backward, counted in the trace with the plan applied."""
    checks: int
    """How many plans were traced to find this one."""
    pitfalls: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...] = ()
    """(module path, why) for each module that cannot be checkpointed and was left out of the search."""
    compared_bytes: int | None = None
    """The figure compared with the budget (`compared`); None where it is the peak itself."""
    compared: str = "peak"
    """Which figure was compared with the budget: "peak" (live tensors) or "reserved" (CUDA: the reserved peak
    plus the CUDA runtime; budget.py)."""
    recompute_seconds: float = 0.0
    """The roofline time of what reruns during backward, on the target (device/roofline.py)."""
    cut_short: str | None = None
    """Where the search stopped at a limit of its own before it had tried everything it would: what it tried."""
    lowest_estimate_bytes: int | None = None
    """The lowest compared figure the planner estimates among the plans it searched at this size (its lowest
    plan's estimate plus what the figure adds to the live peak); None where no plan was needed."""
    searched: str = "module plans"
    """What the planner's options were, in words: "module and segment plans" where it offered runs of a
    container's children (plans/segments.py) beside modules; what an unreachable budget's message says was
    searched."""

    @property
    def judged_bytes(self) -> int:
        """The figure compared with the budget."""
        return self.peak_bytes if self.compared_bytes is None else self.compared_bytes


class TraceFailure(NamedTuple):
    """A plan whose traced step failed (`error`) or whose rerun was no replay (`differs`), kept to replay."""

    error: Exception | None
    differs: tuple[tuple[str, str], ...]


class _Restart:
    """What tracing a plan answers when its step failed: the modules to blame are now excluded, and the search
    starts again with a planner that leaves them out."""


RESTART = _Restart()


class TraceMemo:
    """The plans traced at one size, each once: its summary, or the failure kept to replay it (a step that raised,
    a rerun that was no replay), without the failed step's tensors."""

    def __init__(self, step: StepWorld, kept: dict[Plan, Summary | TraceFailure] | None = None) -> None:
        self.step = step
        self.results: dict[Plan, Summary | TraceFailure] = kept if kept is not None else {}
        """plan -> what its trace gave: the caller's, to carry from one search at this size to the next."""

    def trace(self, plan: Plan) -> Summary | TraceFailure:
        """The plan's step traced, or what failed: read from the memo when it is there."""
        if plan not in self.results:
            error: Exception | None = None
            differs: tuple[tuple[str, str], ...] = ()
            try:
                step_trace = self.step.trace(plan)
            except MemlayoutError:
                raise
            except Exception as exc:
                error = exc.with_traceback(None)  # kept without its frames, which hold a failed step's fake tensors
            else:
                differs = step_trace.rerun_state_differs
            self.results[plan] = (TraceFailure(error, differs) if error is not None or differs
                                  else summarize(step_trace, cuda=self.step.device.startswith("cuda")))
        return self.results[plan]

    def summaries(self) -> dict[Plan, Summary]:
        """The plans whose step ran, with their summaries."""
        return {plan: result for plan, result in self.results.items() if isinstance(result, Summary)}


class Exclusions:
    """The modules no plan may checkpoint, each with why: what the baseline saw them do (`exclusions`), then what
    a traced plan that failed blamed them for."""

    def __init__(self, why: dict[str, str]) -> None:
        self.why = why

    def blame(self, plan: Plan, exc: Exception, retrace: Callable[[Plan], Summary | _Restart]) -> None:
        """Find which modules of a failing plan fail alone, and exclude them (all of them if none fails alone)."""
        singles = [Plan(checkpoint=(path,)) for path in plan.checkpoint] + [Plan(sequential=(s,))
                                                                           for s in plan.sequential]
        singles += [Plan(segments=tuple(s for s in plan.segments if s.module == path))
                    for path in dict.fromkeys(s.module for s in plan.segments)]
        if len(singles) > 1:
            blamed = {}
            for single in singles:
                if retrace(single) is RESTART:
                    blamed.update({p: self.why[p] for p in checkpointed_paths(single) if p in self.why})
            if blamed:
                return
        reason = _failure_reason(exc)
        together = checkpointed_paths(plan)
        for path in together:
            self.why[path] = reason if len(together) == 1 else \
                f"checkpointed together with {', '.join(together)}: {reason}"

    def unfaithful(self, plan: Plan, differs: tuple[tuple[str, str], ...]) -> None:
        """Exclude each checkpointed module whose rerun started a module inside it from other state than forward
        did: the step runs without an error, but its gradients are those of another computation."""
        for checkpointed in checkpointed_paths(plan):
            for path, what in differs:
                if path == checkpointed or path.startswith(checkpointed + ".") or not checkpointed:
                    where = "" if path == checkpointed else f"in {path}, "
                    self.why[checkpointed] = (
                        f"its rerun is no replay: {where}{what} (state kept on the module, which checkpoint does not "
                        "restore)"
                    )
                    break


class BudgetSearch:
    """The budget search at one size: the planner's candidates, each traced once (`memo`), until one fits.

    A candidate whose step fails excludes the modules to blame (`exclusions`), and the search starts again with a
    planner that leaves them out; each round excludes at least one module, so it ends.
    """

    def __init__(self, step: StepWorld, baseline: Trace, summary: Summary, modules: tuple[ModuleFacts, ...],
                 budget: Budget, memo: TraceMemo) -> None:
        self.step, self.baseline, self.summary, self.modules, self.budget = step, baseline, summary, modules, budget
        self.memo = memo
        self.exclusions = Exclusions(exclusions(modules, baseline, step.initial_modules))
        self.checked = memo.summaries()
        """plan -> its summary, for every plan this search (or one before it at this size) traced whole."""
        self.checked.setdefault(Plan(), summary)
        self.estimates: dict[Plan, int] = {Plan(): summary.peak_bytes}
        self.limits: list[str] = []
        """Where the search stopped at a limit of its own rather than for want of plans."""
        self.planner: Planner | None = None

    def run(self, prune: bool) -> PlanResult:
        """The cheapest plan whose traced step fits; BudgetUnreachableError names the lowest figure if none does."""
        for _ in range(len(self.modules) + 1):  # each round excludes at least one module
            self.planner = Planner(self.baseline, self.exclusions.why)
            found = search_plan(self.planner, self.budget, self.trace, self.estimates,
                                overhead=self.budget.overhead(self.summary), limits=self.limits, prune=prune)
            if found is RESTART:
                continue
            if found is not None:
                assert isinstance(found, Plan)
                return self.result(found, self.checked[found])
            break
        plan, measured = min(self.checked.items(), key=lambda item: (self.budget.judged(item[1]),
                                                                     item[1].recompute_seconds, item[1].peak_bytes))
        raise BudgetUnreachableError(self.budget.bytes, self.result(plan, measured))

    def trace(self, plan: Plan) -> Summary | _Restart:
        """The plan's traced summary; RESTART where its step failed, its modules now excluded."""
        if plan in self.checked:
            return self.checked[plan]
        result = self.memo.trace(plan)
        if isinstance(result, TraceFailure):
            error, differs = result
            if error is not None:
                self.exclusions.blame(plan, error, self.trace)
            else:
                self.exclusions.unfaithful(plan, differs)
            return RESTART
        self.checked[plan] = result
        return result

    def result(self, plan: Plan, measured: Summary) -> PlanResult:
        """What the search says of a plan it traced: the plan found, or the lowest reached."""
        budget, planner = self.budget, self.planner
        lowest = None if planner is None else planner.estimate(planner.lowest()) + budget.overhead(self.summary)
        return PlanResult(
            budget_bytes=budget.bytes,
            plan=plan,
            peak_bytes=measured.peak_bytes,
            allocator_peak_bytes=measured.allocator_peak_bytes,
            estimated_peak_bytes=self.estimates.get(plan, measured.peak_bytes),
            recompute_flops=measured.recompute_flops,
            checks=len(self.checked) - 1,
            pitfalls=pitfalls(plan, self.modules, self.step.model),
            excluded=tuple(self.exclusions.why.items()),
            compared_bytes=_compared(budget, measured),
            compared=budget.figure,
            recompute_seconds=measured.recompute_seconds,
            cut_short="; ".join(self.limits) or None,
            lowest_estimate_bytes=lowest,
            searched="module plans" if planner is None else searched(planner),
        )


def plan_for_budget(
    step: StepWorld, baseline: Trace, summary: Summary, modules: tuple[ModuleFacts, ...], budget: Budget | int, *,
    prune: bool = True, traced: dict[Plan, Summary | TraceFailure] | None = None,
) -> PlanResult:
    """The cheapest plan whose traced step fits `budget`; BudgetUnreachableError names the lowest figure if none does.

    `budget` (an int: bytes compared with the live peak) says which figure of a traced step must fit
    (budget.py): on CUDA the reserved peak plus the CUDA runtime. The planner estimates live peaks, so
    it aims below the budget by what the baseline's figure adds to its live peak, and lower again by
    what each traced plan missed by.

    `prune` False skips the last stage, which drops the modules a plan found by tracing does not need:
    whether a plan fits is decided before it, so `--fit`'s probes, which ask only that, skip it, and the
    search at the answer runs it. `traced` keeps the plans traced at this size from one search to the
    next (the caller's, for the same step and inputs), so that search traces only what is new.
    A failed trace is kept there too, and replayed, so the search takes the same path as the first.
    Nothing learned at one size is carried to another: the search's path depends on the order in which
    it learns what fails, and `--fit`'s search at a size must be the one `--budget` runs there.
    """
    if isinstance(budget, int):
        budget = Budget(budget, f"{budget} bytes")
    if budget.bytes < 0:
        raise UsageError(f"the budget {budget.bytes} is negative")
    if budget.fits(summary):
        excluded = exclusions(modules, baseline, step.initial_modules)
        return PlanResult(budget.bytes, Plan(), summary.peak_bytes, summary.allocator_peak_bytes, summary.peak_bytes,
                          0, 0, (), tuple(excluded.items()), _compared(budget, summary), budget.figure)
    return BudgetSearch(step, baseline, summary, modules, budget, TraceMemo(step, traced)).run(prune)


def lowest_plan_summary(
    step: StepWorld, baseline: Trace, modules: tuple[ModuleFacts, ...], traced: dict[Plan, Summary | TraceFailure],
) -> tuple[Plan, Summary] | None:
    """The planner's lowest plan at this size, traced: the lowest figure its estimate aims for, which `--fit`
    draws its first line through. None when that plan is empty, its step fails or its rerun is no replay (the
    budget search, meeting the failure kept in `traced`, then learns why, as it would have).

    Traced into the same `traced` memo the budget search at this size reads (the caller's), so that search
    reads it rather than tracing it again: it traces its planner's lowest plan before it calls a budget
    unreachable, and its first planner is this one.
    """
    planner = Planner(baseline, exclusions(modules, baseline, step.initial_modules))
    plan = planner.plan_of(planner.lowest())
    if plan.empty:
        return None
    result = TraceMemo(step, traced).trace(plan)
    return (plan, result) if isinstance(result, Summary) else None


def searched(planner: Planner) -> str:
    """The kinds of plan the planner's options make, in words."""
    segments = any(o.segments is not None or o.span is not None for o in planner.options)
    modules = any(o.segments is None and o.span is None for o in planner.options)
    return ("module and segment plans" if modules and segments else "segment plans" if segments
            else "module plans")


def _compared(budget: Budget, summary: Summary) -> int | None:
    return None if budget.runtime_bytes is None else budget.judged(summary)


def search_plan(
    planner: Planner, budget: Budget, trace: Callable[[Plan], Summary | _Restart], estimates: dict[Plan, int], *,
    overhead: int = 0, limits: list[str] | None = None, prune: bool = True,
) -> Plan | _Restart | None:
    """The cheapest plan found whose traced step fits the budget; None where none does, and RESTART where a traced
    plan failed (`trace` said so): the caller's search starts again without the modules it blamed.

    `overhead` is what the compared figure adds to the live peak (0 on the CPU); `limits`
    collects where the search stopped at a limit of its own rather than for want of plans;
    `prune` False keeps a whole-level plan whole (plan_for_budget says when).
    """

    def check(chosen: list[int]) -> tuple[Plan, Summary | _Restart]:
        plan = planner.plan_of(chosen)
        estimates.setdefault(plan, planner.estimate(chosen))
        return plan, trace(plan)

    target = budget.bytes - overhead
    for attempt in range(MAX_CHECKS):
        chosen = planner.search(target)
        if chosen is None:
            break
        plan, measured = check(chosen)
        if isinstance(measured, _Restart):
            return RESTART
        if budget.fits(measured):
            return plan
        # The estimate was short by this much: aim lower by the same amount.
        target -= max(budget.judged(measured) - budget.bytes, 1)
        if attempt == MAX_CHECKS - 1 and limits is not None:
            limits.append(f"the estimate-led search stopped after {MAX_CHECKS} traced plans")
    # Before calling the budget unreachable, trace what the estimate cannot judge: its own lowest plan, the
    # lowest without runs of children on their own (the estimate can rank a segment plan first that a
    # module plan beats when traced), and every module of one level checkpointed together, unless the
    # estimate puts that far over the budget.
    lowest, unsegmented = planner.lowest(), planner.lowest(segments=False)
    fitting = []
    for chosen in [lowest, *([unsegmented] if sorted(unsegmented) != sorted(lowest) else []),
                   *planner.covers(budget.bytes)]:
        plan, measured = check(chosen)
        if isinstance(measured, _Restart):
            return RESTART
        if budget.fits(measured):
            fitting.append((chosen, plan, measured))
    if not fitting:
        return None
    chosen, plan, measured = min(fitting, key=lambda item: (item[2].recompute_seconds, item[2].peak_bytes))
    return _pruned(planner, budget, check, (chosen, plan, measured), limits) if prune else plan


def _pruned(planner: Planner, budget: Budget, check: Callable[[list[int]], tuple[Plan, Summary | _Restart]],
            found: tuple[list[int], Plan, Summary], limits: list[str] | None) -> Plan | _Restart:
    """A whole-level plan without the modules the budget does not need (two of eight residual blocks reach what
    all eight do): each dropped while the traced step still fits, the costliest and the latest in the model first."""
    chosen, plan, measured = found
    rows = sorted(chosen, key=lambda r: (-planner.options[r].seconds, -r))
    if len(rows) > PRUNE_CHECKS and limits is not None:
        limits.append(f"{len(rows) - PRUNE_CHECKS} of the plan's {len(rows)} modules were kept without trying "
                      f"the plan without each (at most {PRUNE_CHECKS} tries)")
    for row in rows[:PRUNE_CHECKS]:
        trial = [r for r in chosen if r != row]
        if not trial:
            continue
        # Near the budget's edge, where `--fit`'s answer is, a plan has little room left and dropping a
        # whole block would bring back gigabytes: a drop the planner prices at more than PRUNE_ROOM times
        # the room left is not traced (Llama-7B at its answer on an H100: each block's drop, traced, raised
        # the figure by 8.4 to 11.3 GB, priced at 8.8 GB, with 0.6 GB of room).
        room = budget.bytes - budget.judged(measured)
        if planner.estimate(trial) - planner.estimate(chosen) > PRUNE_ROOM * room:
            continue
        trial_plan, trial_measured = check(trial)
        if isinstance(trial_measured, _Restart):
            return RESTART
        if budget.fits(trial_measured):
            chosen, plan, measured = trial, trial_plan, trial_measured
    return plan


def exclusions(
    modules: tuple[ModuleFacts, ...], trace: Trace, initial_modules: frozenset[tuple[str, str]] | None
) -> dict[str, str]:
    """module path -> why it cannot be checkpointed, from what the baseline trace saw it do."""
    excluded: dict[str, str] = {}
    for m in modules:
        if not m.path:
            continue
        if initial_modules is not None and (m.path, m.class_name) not in initial_modules:
            excluded[m.path] = (
                "created during forward: a model built afresh does not have it yet, so a plan cannot name it"
            )
        elif m.mutates_inputs:
            excluded[m.path] = ("writes in place into a tensor it received: its rerun would start from the changed "
                                "values")
        elif m.changes_state is not None:
            inner, _, what = m.changes_state.partition(": ")
            who = "its forward changes" if inner == m.path else f"{inner} inside it changes"
            excluded[m.path] = (
                f"{who} {what} (plain Python state): a rerun in backward would see the changed state, not the one "
                "forward saw"
            )
    return excluded


def _failure_reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if type(exc).__name__ == "CheckpointError":
        return (
            f"its recompute differs from its forward (torch.utils.checkpoint raised CheckpointError: {text}); a "
            "shape computed from state that changes between forward and recompute does this"
        )
    return f"checkpointed, the step raised {type(exc).__name__}: {text}"
