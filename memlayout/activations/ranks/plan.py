"""A plan under which the largest rank fits a budget: resharding, activation checkpointing, CPU offload.

The moves, cheapest first:

1. `reshard_after_forward=True` on wrapped modules that keep their gathered
   parameters from forward to backward: each costs one more all-gather in
   backward, and frees a block's whole parameters meanwhile. The modules used
   first in forward (whose backward comes last, so they are held longest) are
   resharded first, as few as the budget needs.
2. Activation checkpointing, chosen by the single-device planner (plan.py) from a
   trace of one rank's step on one device: FSDP2 and tensor parallel change where
   the parameters are, not which activations a module saves, so the planner's
   cheapest modules are the cheapest here too. Its estimate is aimed lower by
   whatever the sharded trace shows it missed.
3. CPU offload (`CPUOffloadPolicy`), only when allowed: parameters, gradients and
   optimizer state move to the host, and the host's slower optimizer step and
   the copies each step are its price.

Every plan is traced on the fake ranks with the plan applied before it is
returned, and the figures reported are that trace's, as in the single-device
planner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memlayout.activations.plans.pitfalls import pitfalls
from memlayout.activations.plans.plan import Plan, Planner, SequentialSegments
from memlayout.activations.ranks.facts import RankPeak, RanksPlan, RanksReport
from memlayout.activations.ranks.parallel import Sharding
from memlayout.activations.search import exclusions
from memlayout.errors import RanksBudgetUnreachableError, UsageError

MAX_CHECKS = 6
"""Checkpoint plans traced at most while aiming the estimate, before the whole-level plans."""
PRUNE_CHECKS = 8
"""At most this many more traces to drop modules a whole-level plan does not need."""


Measure = Callable[[Sharding], tuple[RankPeak, ...]]


def plan_ranks(
    report: RanksReport,
    budget: int,
    *,
    measure: Measure,
    single_device: Callable[[], Any],
    model: Any,
    allow_offload: bool,
) -> RanksPlan:
    """The cheapest plan found under which every traced rank's peak is within `budget`.

    Args:
        report: The prediction without a plan.
        budget: Bytes per rank.
        measure: Traces the ranks with a sharding applied; the first of its results is the largest rank.
        single_device: Returns the single-device `ActivationReport` of one rank's step (for the planner).
        model: The model on the meta device (for the pitfalls).
        allow_offload: Whether CPU offload may be used.

    Returns:
        The plan, traced on the ranks.

    Raises:
        RanksBudgetUnreachableError: nothing tried fits; it carries the lowest plan.
    """
    if budget < 0:
        raise UsageError(f"the budget {budget} is negative")
    search = RanksPlanSearch(report, budget, measure)
    if search.largest(report.sharding) <= budget:
        return search.result(report.sharding, None)
    resharded = search.fewest_resharded()
    if isinstance(resharded, Sharding) and search.largest(resharded) <= budget:
        return search.result(resharded, None)
    base = resharded if resharded is not None else report.sharding
    search.start_checkpointing(single_device(), model)
    found = search.checkpointed(base)
    if found is not None:
        return found
    tried = "every block resharded after forward and " if resharded is not None else ""
    tried += "the planner's checkpoint plans"
    # 3. CPU offload, when allowed and when it can free anything: on the CPU it frees nothing, and is not tried.
    if allow_offload and report.device.startswith("cuda"):
        offloaded = base.with_changes(offload=True)
        if search.largest(offloaded) <= budget:
            return search.result(offloaded, None)
        found = search.checkpointed(offloaded)
        if found is not None:
            return found
        tried += ", with and without CPU offload"
    raise RanksBudgetUnreachableError(budget, search.lowest(base), tried)


class RanksPlanSearch:
    """The moves tried on the ranks, each sharding traced once (`largest`), and what the plan found says of itself."""

    def __init__(self, report: RanksReport, budget: int, measure: Measure) -> None:
        self.report, self.budget, self.measure = report, budget, measure
        self.baseline = report.sharding
        self.measured: dict[Sharding, tuple[RankPeak, ...]] = {self.baseline: report.ranks}
        self.excluded: dict[str, str] = {}
        self.options: list[tuple[Sharding, int | None, int]] = []
        """Every checkpoint plan traced: (sharding, the planner's estimate, recompute FLOPs), for the lowest."""
        self.planner: Planner | None = None
        self.single: Any = None
        self.model: Any = None

    def largest(self, sharding: Sharding) -> int:
        """The largest rank's figure under `sharding`, traced once: on CUDA its reserved peak and the runtime beside
        it, on the CPU its peak of live tensors (RankPeak.judged_bytes)."""
        if sharding not in self.measured:
            self.measured[sharding] = self.measure(sharding)
        return max(r.judged_bytes for r in self.measured[sharding])

    def result(self, sharding: Sharding, estimate: int | None, flops: int = 0) -> RanksPlan:
        baseline = self.baseline
        resharded = tuple(
            path for path, on in sharding.resharded().items() if path and on and not baseline.resharded()[path]
        )
        found_pitfalls = self._pitfalls(sharding) if self.planner is not None and estimate is not None else ()
        return RanksPlan(
            budget_bytes=self.budget, sharding=sharding, resharded=resharded,
            offload=sharding.offload and not baseline.offload, ranks=self.measured[sharding],
            estimated_peak_bytes=estimate, recompute_flops=flops, checks=len(self.measured) - 1,
            pitfalls=found_pitfalls, excluded=tuple(self.excluded.items()),
        )

    def fewest_resharded(self) -> Sharding | None:
        """1. Reshard after forward: as few modules as fit, the first used in forward first; where resharding every
        held module does not fit either, that sharding (the base of the next moves); None where none is held."""
        held = [path for path, on in self.baseline.resharded().items() if path and not on]
        if not held:
            return None
        every = self._resharding(held, len(held))
        if self.largest(every) > self.budget:
            return every
        low, high = 0, len(held)  # resharding `high` modules fits; `low` does not
        while high - low > 1:
            middle = (low + high) // 2
            if self.largest(self._resharding(held, middle)) <= self.budget:
                high = middle
            else:
                low = middle
        return self._resharding(held, high)

    def _resharding(self, held: list[str], count: int) -> Sharding:
        chosen = set(held[:count])
        return self.baseline.with_changes(reshard_after_forward=tuple(
            on or path in chosen for path, on in self.baseline.resharded().items()
        ))

    def start_checkpointing(self, single: Any, model: Any) -> None:
        """2. Activation checkpointing, from the single-device planner on one rank's step (`single`)."""
        self.single, self.model = single, model
        # Modules the single-device step shows cannot be checkpointed (they change state, or write into their inputs).
        self.excluded.update(exclusions(single.modules, single.trace, None))
        # A rank's plan is applied by the sharding code it prints (Sharding), which names modules and
        # checkpoint_sequential's splits: runs of children on their own are left out.
        self.planner = Planner(single.trace, self.excluded, segments=False)

    def _with_plan(self, on: Sharding, chosen: list[int]) -> Sharding:
        assert self.planner is not None
        plan = self.planner.plan_of(chosen)
        # The modules the user checkpoints (`ac_modules`) stay checkpointed; the plan's are added.
        return on.with_changes(
            checkpoint=tuple(dict.fromkeys((*on.checkpoint, *plan.checkpoint))),
            sequential=tuple((s.module, s.segments) for s in plan.sequential),
        )

    def checkpointed(self, on: Sharding) -> RanksPlan | None:
        """The cheapest checkpoint plan on top of `on` that fits, traced; None when none was found."""
        planner, budget = self.planner, self.budget
        assert planner is not None
        shift = self.largest(on) - planner.baseline_peak
        tried: dict[Sharding, list[int]] = {}
        target = budget - shift
        for _ in range(MAX_CHECKS):
            chosen = planner.search(target)
            if chosen is None:
                break
            candidate = self._with_plan(on, chosen)
            tried[candidate] = chosen
            peak = self.largest(candidate)
            if peak <= budget:
                return self.result(candidate, planner.estimate(chosen) + shift, planner.recompute_flops(chosen))
            target -= max(peak - budget, 1)
        for chosen in (planner.lowest(), *planner.covers()):
            candidate = self._with_plan(on, chosen)
            tried.setdefault(candidate, chosen)
            self.largest(candidate)
        fitting = [s for s in tried if self.largest(s) <= budget]
        for candidate in tried:
            self.options.append((candidate, planner.estimate(tried[candidate]) + shift,
                                 planner.recompute_flops(tried[candidate])))
        if not fitting:
            return None
        best = min(fitting, key=lambda s: (planner.recompute_flops(tried[s]), self.largest(s)))
        chosen = tried[best]
        for row in sorted(chosen, key=lambda r: (-planner.options[r].flops, -r))[:PRUNE_CHECKS]:
            trial = [r for r in chosen if r != row]
            if not trial:
                continue
            candidate = self._with_plan(on, trial)
            if self.largest(candidate) <= budget:
                best, chosen = candidate, trial
        return self.result(best, planner.estimate(chosen) + shift, planner.recompute_flops(chosen))

    def _pitfalls(self, sharding: Sharding) -> tuple[str, ...]:
        plan = Plan(sharding.checkpoint, tuple(SequentialSegments(m, s) for m, s in sharding.sequential))
        # The sharding code passes use_reentrant=False itself, so the pitfall about it is moot here.
        return tuple(p for p in pitfalls(plan, self.single.modules, self.model) if "use_reentrant" not in p)

    def lowest(self, base: Sharding) -> RanksPlan:
        """The lowest plan traced, for the error that says none fits."""
        lowest, estimate, flops = min(self.options or [(base, None, 0)], key=lambda item: self.largest(item[0]))
        return self.result(lowest, estimate, flops)
