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

from memlayout.activations.plans.plan import Plan, Planner, SequentialSegments
from memlayout.activations.ranks.facts import RankPeak, RanksPlan, RanksReport
from memlayout.activations.ranks.parallel import Sharding
from memlayout.activations.search import exclusions, pitfalls
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
) -> tuple[RanksPlan, tuple[str, ...]]:
    """The cheapest plan found under which every traced rank's peak is within `budget`.

    Args:
        report: The prediction without a plan.
        budget: Bytes per rank.
        measure: Traces the ranks with a sharding applied; the first of its results is the largest rank.
        single_device: Returns the single-device `ActivationReport` of one rank's step (for the planner).
        model: The model on the meta device (for the pitfalls).
        allow_offload: Whether CPU offload may be used.

    Returns:
        The plan, and notes about moves that were not tried.

    Raises:
        RanksBudgetUnreachableError: nothing tried fits; it carries the lowest plan.
    """
    if budget < 0:
        raise UsageError(f"the budget {budget} is negative")
    baseline = report.sharding
    measured: dict[Sharding, tuple[RankPeak, ...]] = {baseline: report.ranks}
    notes: list[str] = []

    def largest(sharding: Sharding) -> int:
        if sharding not in measured:
            measured[sharding] = measure(sharding)
        return max(r.peak_bytes for r in measured[sharding])

    excluded: dict[str, str] = {}

    def result(sharding: Sharding, estimate: int | None, found_pitfalls: tuple[str, ...] = (), flops: int = 0) -> RanksPlan:
        resharded = tuple(
            path for path, on in sharding.resharded().items() if path and on and not baseline.resharded()[path]
        )
        return RanksPlan(
            budget_bytes=budget, sharding=sharding, resharded=resharded, offload=sharding.offload and not baseline.offload,
            ranks=measured[sharding], estimated_peak_bytes=estimate, recompute_flops=flops, checks=len(measured) - 1,
            pitfalls=found_pitfalls, excluded=tuple(excluded.items()),
        )

    if largest(baseline) <= budget:
        return result(baseline, None), ()

    # 1. Reshard after forward: as few modules as fit, the first used in forward first.
    held = [path for path, on in baseline.resharded().items() if path and not on]
    base = baseline
    if held:
        def resharding(count: int) -> Sharding:
            chosen = set(held[:count])
            return baseline.with_changes(reshard_after_forward=tuple(
                on or path in chosen for path, on in baseline.resharded().items()
            ))

        every = resharding(len(held))
        if largest(every) <= budget:
            low, high = 0, len(held)  # resharding `high` modules fits; `low` does not
            while high - low > 1:
                middle = (low + high) // 2
                if largest(resharding(middle)) <= budget:
                    high = middle
                else:
                    low = middle
            return result(resharding(high), None), ()
        base = every

    # 2. Activation checkpointing, from the single-device planner.
    single = single_device()
    # Modules the single-device step shows cannot be checkpointed (they change state, or write into their inputs).
    excluded.update(exclusions(single.modules, single.trace, None))
    # A rank's plan is applied by the sharding code it prints (Sharding), which names modules and
    # checkpoint_sequential's splits: runs of children on their own are left out.
    planner = Planner(single.trace, excluded, segments=False)
    options: list[tuple[Sharding, int | None, int]] = []

    def checkpointed(on: Sharding, chosen: list[int]) -> Sharding:
        plan = planner.plan_of(chosen)
        return on.with_changes(
            checkpoint=plan.checkpoint, sequential=tuple((s.module, s.segments) for s in plan.sequential)
        )

    def search(on: Sharding) -> tuple[Sharding, int, int] | None:
        """The cheapest checkpoint plan on top of `on` that fits, traced; None when none was found."""
        shift = largest(on) - planner.baseline_peak
        tried: dict[Sharding, list[int]] = {}
        target = budget - shift
        for _ in range(MAX_CHECKS):
            chosen = planner.search(target)
            if chosen is None:
                break
            candidate = checkpointed(on, chosen)
            tried[candidate] = chosen
            peak = largest(candidate)
            if peak <= budget:
                return candidate, planner.estimate(chosen) + shift, planner.recompute_flops(chosen)
            target -= max(peak - budget, 1)
        for chosen in (planner.lowest(), *planner.covers()):
            candidate = checkpointed(on, chosen)
            tried.setdefault(candidate, chosen)
            largest(candidate)
        fitting = [s for s in tried if largest(s) <= budget]
        for candidate in tried:
            options.append((candidate, planner.estimate(tried[candidate]) + shift, planner.recompute_flops(tried[candidate])))
        if not fitting:
            return None
        best = min(fitting, key=lambda s: (planner.recompute_flops(tried[s]), largest(s)))
        chosen = tried[best]
        for row in sorted(chosen, key=lambda r: (-planner.options[r].flops, -r))[:PRUNE_CHECKS]:
            trial = [r for r in chosen if r != row]
            if not trial:
                continue
            candidate = checkpointed(on, trial)
            if largest(candidate) <= budget:
                best, chosen = candidate, trial
        return best, planner.estimate(chosen) + shift, planner.recompute_flops(chosen)

    def with_pitfalls(sharding: Sharding) -> tuple[str, ...]:
        plan = Plan(sharding.checkpoint, tuple(SequentialSegments(m, s) for m, s in sharding.sequential))
        # The sharding code passes use_reentrant=False itself, so the pitfall about it is moot here.
        return tuple(p for p in pitfalls(plan, single.modules, model) if "use_reentrant" not in p)

    found = search(base)
    if found is not None:
        return result(found[0], found[1], with_pitfalls(found[0]), found[2]), tuple(notes)
    tried = "every block resharded after forward and " if held else ""
    tried += "the planner's checkpoint plans"

    # 3. CPU offload, when allowed and when it can free anything.
    if allow_offload and report.device.startswith("cuda"):
        offloaded = base.with_changes(offload=True)
        if largest(offloaded) <= budget:
            return result(offloaded, None), tuple(notes)
        found = search(offloaded)
        if found is not None:
            return result(found[0], found[1], with_pitfalls(found[0]), found[2]), tuple(notes)
        tried += ", with and without CPU offload"
    elif allow_offload:
        notes.append(
            f"--allow-offload: the step runs on {report.device}, where offloading to the CPU frees nothing, so it "
            "was not tried"
        )
    lowest, estimate, flops = min(options or [(base, None, 0)], key=lambda item: largest(item[0]))
    raise RanksBudgetUnreachableError(budget, result(lowest, estimate, with_pitfalls(lowest), flops), tried)
