"""Checkpoint plans: which modules to checkpoint, and how the peak is expected to move.

Pure: a `Planner` reads a baseline `Trace` and proposes plans; it never runs a
model. The search (search.py) traces each proposal again with the plan
applied, and only that trace's peak is reported.

The estimate. An option (a module, or a run of children: plans/segments.py) frees
storages from the end of its forward until its backward begins, keeps its inputs,
and reruns at that moment (plans/effects.py). The live-bytes curve of the baseline
is cut at those event numbers into intervals; each option's effect is one row of a
matrix over the intervals, and a plan's estimated peak is the maximum of the
baseline's interval maxima plus the rows of its options.

The search. Cheapest means least recompute time: the roofline time of what is
rerun on the target (device/roofline.py), each op's FLOPs or the bytes it moves,
whichever binds, so a norm layer, 0 FLOPs to torch's counter, is not free. Options
are taken greedily by estimated peak reduction per second, a module may replace
the options inside it, and options that turn out not to be needed are dropped
again, most expensive first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.activations.facts import ModuleCall, Trace
from memlayout.activations.plans.effects import Effects
from memlayout.activations.plans.lowest import conflict_matrix, lowest_options, pruned
from memlayout.activations.plans.options import Option
from memlayout.activations.plans.segments import (
    Container,
    containers,
    equal_split,
    equal_split_options,
    span_options,
)
from memlayout.activations.summary import live_curve
from memlayout.errors import UsageError

if TYPE_CHECKING:
    import numpy as np


COVER_SKIP = 3
"""`covers` leaves out a cover estimated at more than this many times the budget: over 242 covers `--fit` traced,
the estimate ran from 8% under to 142% over the traced live peak (benchmarks/README.md, bench_fit.py). Left out
wrongly, a cover could only make an answer smaller, never one that runs out."""


@dataclass(frozen=True)
class SequentialSegments:
    """Run an nn.Sequential through `checkpoint_sequential(module, segments, input)`."""

    module: str
    segments: int


@dataclass(frozen=True)
class Segment:
    """Checkpoint children `first` to `last` (indexes among the children of `module`) as one
    (plans/segments.py: an nn.Sequential the model calls, or a container it iterates, such as an nn.ModuleList)."""

    module: str
    first: int
    last: int


@dataclass(frozen=True)
class Plan:
    """What to checkpoint. Paths are dotted module paths from the model."""

    checkpoint: tuple[str, ...] = ()
    """Modules to wrap with `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`."""
    sequential: tuple[SequentialSegments, ...] = ()
    selective: tuple[tuple[str, str], ...] = ()
    """(module, policy): checkpointed with an op-level policy (plans/op_policies.py), its saved ops' outputs kept."""
    segments: tuple[Segment, ...] = ()
    """Runs of children checkpointed as one each, where they are not `checkpoint_sequential`'s equal split."""

    @property
    def empty(self) -> bool:
        return not self.checkpoint and not self.sequential and not self.selective and not self.segments

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": list(self.checkpoint),
            "sequential": [{"module": s.module, "segments": s.segments} for s in self.sequential],
            **({"selective": [{"module": m, "policy": p} for m, p in self.selective]} if self.selective else {}),
            "segments": [{"module": s.module, "first": s.first, "last": s.last} for s in self.segments],
        }

    @classmethod
    def coerce(cls, plan: Plan | Mapping[str, Any]) -> Plan:
        """A Plan, or the `plan` object of a JSON report (extra keys are ignored)."""
        if isinstance(plan, Plan):
            return plan
        if not isinstance(plan, Mapping):
            raise UsageError(f"a plan is a Plan or a mapping with 'checkpoint' and 'sequential', not {type(plan).__name__}")
        try:
            checkpoint = tuple(str(path) for path in plan.get("checkpoint", ()))
            sequential = tuple(
                SequentialSegments(module=str(item["module"]), segments=int(item["segments"]))
                for item in plan.get("sequential", ())
            )
            selective = tuple((str(item["module"]), str(item["policy"])) for item in plan.get("selective", ()))
            segments = tuple(
                Segment(module=str(item["module"]), first=int(item["first"]), last=int(item["last"]))
                for item in plan.get("segments", ())
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"the plan is malformed: {exc}", "pass report.plan or a JSON report's 'plan' object") from exc
        return cls(checkpoint=checkpoint, sequential=sequential, selective=selective, segments=segments)


def _paths_order(trace: Trace) -> dict[str, int]:
    return {info.path: position for position, info in enumerate(trace.modules)}


class Planner:
    """Estimates plan peaks from a baseline trace and searches for the cheapest plan under a target."""

    def __init__(self, trace: Trace, excluded: Iterable[str] = (), *, segments: bool = True) -> None:
        """`excluded`: module paths that cannot be checkpointed; no option names one. `segments` False offers
        no run of children on its own (plans/segments.py), only modules and `checkpoint_sequential`'s splits."""
        self.trace = trace
        self.excluded = frozenset(excluded)
        self.with_segments = segments
        self.containers: dict[str, Container] = {}
        self.curve = live_curve(trace)
        self.baseline_peak = int(self.curve.max()) if len(self.curve) else 0
        self._effects = Effects(trace, self.curve)
        self._inside = self._effects.inside
        self.options = self._options()
        self._build_matrix()
        self._lowest: dict[bool, list[int]] = {}

    # options ----------------------------------------------------------------
    def _options(self) -> list[Option]:
        trace = self.trace
        calls_by_path: dict[str, list[ModuleCall]] = {}
        for call in trace.calls:
            if not call.recompute:
                calls_by_path.setdefault(call.path, []).append(call)
        options: list[Option] = []
        for info in trace.modules:
            calls = calls_by_path.get(info.path)
            if not calls or info.path in self.excluded:
                continue
            # A call run under no_grad (as recurrent models run most of their cycles) saves nothing and
            # is not rerun: checkpoint changes nothing there.
            reached = [(call, gap) for call in calls for gap in self._effects.gaps(call, call)]
            # Checkpointing the whole model frees nothing before its backward begins.
            if info.path and any(gap.freed > gap.kept_inputs for _, gap in reached):
                rerun = [trace.calls[i] for call, gap in reached if gap.reruns for i in self._inside[call.id]]
                options.append(Option(info.path, None, sum(c.flops for c in rerun), tuple(gap for _, gap in reached),
                                      sum(c.seconds for c in rerun)))
        in_place = frozenset(c.path for c in trace.calls if c.mutates_inputs)
        for container in containers(trace, self.excluded):
            self.containers[container.path] = container
            effects = self._effects
            options.extend(equal_split_options(container, self.excluded, in_place, effects.gaps, effects.rerun_calls))
            if self.with_segments:
                options.extend(span_options(container, self.excluded, in_place, effects.gaps, effects.rerun_calls))
        return options

    # the estimate -------------------------------------------------------------
    def _build_matrix(self) -> None:
        import numpy as np

        events = self.trace.events
        cuts = {0}
        for option in self.options:
            for gap in option.gaps:
                cuts.update(point for point in (gap.end + 1, gap.backward_start, gap.backward_start + 1,
                                                (gap.released or 0) + 1) if point <= events)
        # Interval j holds events starts[j] .. starts[j+1]-1; a gap (end, backward_start] is whole intervals, and
        # the rerun's overhead is the gap's last event alone: backward_start is the last event before the call's
        # first backward op, whose unpacking of a saved tensor starts the rerun, and the rerun frees its
        # temporaries before that op goes on. Added over the interval after it, the overhead met the next ops'
        # gradients: a Sequential MLP's first three children checkpointed, 6.50 MB estimated, 5.72 MB measured.
        starts = np.array(sorted(cuts), dtype=np.int64)
        self._interval_max = np.maximum.reduceat(self.curve, starts) if len(self.curve) else np.zeros(1, np.int64)
        width = len(starts)

        def interval(event: int) -> int:
            return int(np.searchsorted(starts, event, side="right")) - 1 if event <= events else width

        self._rows = np.zeros((len(self.options), width), dtype=np.int64)
        for row, option in enumerate(self.options):
            for gap in option.gaps:
                first, last = interval(gap.end + 1), interval(gap.backward_start + 1)
                self._rows[row, first:last] -= gap.freed - gap.kept_inputs
                if gap.backward_start <= events:
                    self._rows[row, interval(gap.backward_start)] += gap.rerun_overhead
                if gap.released is not None and gap.released > gap.backward_start:
                    self._rows[row, last:interval(gap.released + 1)] += gap.kept_after
        self._costs = np.array([o.seconds for o in self.options], dtype=np.float64)
        self._conflicts = conflict_matrix(self.options)
        self._conflicting: list[list[bool]] = self._conflicts.tolist()  # the greedy search reads one pair at a time

    def estimate(self, chosen: Iterable[int]) -> int:
        """Estimated peak with these options (indexes into `options`) applied."""
        values = self._interval_max.copy()
        for row in chosen:
            values += self._rows[row]
        return int(values.max())

    # the search ---------------------------------------------------------------
    def search(self, target: int) -> list[int] | None:
        """The cheapest options found whose estimated peak is at most `target`; None if none reach it.

        Greedy by bytes per second of recompute; at every step the cheapest single move that would reach
        the target from there is kept as a candidate, and the cheapest candidate wins
        (the usual greedy for a covering knapsack, which alone can overshoot a lot).
        """
        chosen: list[int] = []
        values = self._interval_max.copy()
        candidates: list[list[int]] = []
        while True:
            if int(values.max()) <= target:
                candidates.append(list(chosen))
                break
            ratio_move, finishing = self._moves(chosen, values, target)
            if finishing is not None:
                candidates.append(self._applied(chosen, finishing))
            if ratio_move is None:
                break
            chosen, values = self._apply(chosen, values, ratio_move)
        if not candidates:
            return None
        pruned = [self._prune(candidate, target) for candidate in candidates]
        return min(pruned, key=lambda rows: (sum(self._costs[r] for r in rows), len(rows), sorted(rows)))

    def lowest(self, segments: bool = True) -> list[int]:
        """The options of the lowest estimated peak this planner reaches (a beam search: plans/lowest.py), from
        the empty plan and, apart, from the covers; with `segments` False, among the options that are no run of
        children on its own (plans/segments.py). Searched once: a search asks for it again each round."""
        import numpy as np

        if segments not in self._lowest:
            rows = [r for r, o in enumerate(self.options) if segments or o.span is None]
            seeds = self.covers() + (self._splits_as_runs() if segments else [])
            found, _ = lowest_options(self._interval_max, self._rows[rows], self._costs[rows],
                                      self._conflicts[np.ix_(rows, rows)],
                                      seeds=[[rows.index(r) for r in seed] for seed in seeds])
            self._lowest[segments] = pruned(self._interval_max, self._rows, self._costs, [rows[r] for r in found])
        return list(self._lowest[segments])

    def _splits_as_runs(self) -> list[list[int]]:
        """Each `checkpoint_sequential` split as its runs, one option each, for the beam to move one boundary at a
        time: from the split whole, moving a boundary is two moves, the first of which raises the peak (the
        issue's CNN: 4 equal segments, 101.5 MB estimated and measured; children 0-10 and 11-13, 97.3 MB)."""
        spans = {(o.path, o.span): row for row, o in enumerate(self.options) if o.span is not None}
        seeds = []
        for option in self.options:
            if option.segments is None:
                continue
            size = len(self.containers[option.path].children) // option.segments
            runs = [spans.get((option.path, (first, first + size - 1)))
                    for first in range(0, size * (option.segments - 1), size)]
            if all(row is not None for row in runs):
                seeds.append([row for row in runs if row is not None])
        return seeds

    def covers(self, budget: int | None = None) -> list[list[int]]:
        """Plans that checkpoint every module of one level: the shallowest modules, and the deepest.

        The estimate adds options one at a time, so it can miss what several do
        together: in a stack of residual blocks, checkpointing one block moves the
        peak to its rerun, where one more block alone gains nothing, yet checkpointing
        every block lowers the peak further (measured: 39.6 MiB for one block, 37.6 MiB
        for all eight, tests/activations/plans/test_plan.py). These plans are traced too before a budget is called
        unreachable, less, with `budget`, those estimated at over COVER_SKIP times it: every figure compared
        with a budget is at least the live peak, and no estimate has run that far over it."""
        singles = [row for row, option in enumerate(self.options) if option.segments is None and option.span is None]
        found: list[list[int]] = []
        for deepest_first in (False, True):
            ordered = sorted(singles, key=lambda row: self.options[row].path.count("."), reverse=deepest_first)
            chosen: list[int] = []
            for row in ordered:
                if not any(self._conflicting[row][other] for other in chosen):
                    chosen.append(row)
            if chosen and sorted(chosen) not in found and (budget is None or self.estimate(chosen) <= COVER_SKIP * budget):
                found.append(sorted(chosen))
        return found

    def _applied(self, chosen: list[int], move: tuple[int, list[int]]) -> list[int]:
        add, remove = move
        return [row for row in chosen if row not in remove] + [add]

    def _apply(self, chosen: list[int], values: np.ndarray, move: tuple[int, list[int]]) -> tuple[list[int], np.ndarray]:
        add, remove = move
        values = values + self._rows[add]
        for row in remove:
            values = values - self._rows[row]
        return self._applied(chosen, move), values

    def _moves(
        self, chosen: list[int], values: np.ndarray, target: int | None
    ) -> tuple[tuple[int, list[int]] | None, tuple[int, list[int]] | None]:
        """The best move by peak bytes saved per second, and the cheapest move that reaches `target`.

        A move adds one option and drops the chosen options it conflicts with (a module
        replacing the modules inside it).
        """
        if not self.options:
            return None, None
        peak = int(values.max())
        peaks = (values[None, :] + self._rows).max(axis=1)
        taken = set(chosen)
        best: tuple[float, int, int, list[int]] | None = None
        finishing: tuple[float, int, int, list[int]] | None = None
        for row in range(len(self.options)):
            if row in taken:
                continue
            conflicting = self._conflicting[row]
            conflicts = [other for other in chosen if conflicting[other]]
            new_peak = int(peaks[row])
            added = float(self._costs[row])
            if conflicts:
                adjusted = values + self._rows[row]
                for other in conflicts:
                    adjusted = adjusted - self._rows[other]
                new_peak = int(adjusted.max())
                added -= float(sum(self._costs[other] for other in conflicts))
            gain = peak - new_peak
            if gain <= 0:
                continue
            if target is not None and new_peak <= target and (
                finishing is None or (added, -gain) < (finishing[0], -finishing[1])
            ):
                finishing = (added, gain, row, conflicts)
            # Free (zero-second) moves first, largest gain first; then the most bytes per second, counting
            # only the bytes still needed (a move that overshoots the target gets no credit for it).
            useful = gain if target is None else min(gain, peak - target)
            score = float("inf") if added <= 0 else useful / added
            if best is None or (score, gain) > (best[0], best[1]):
                best = (score, gain, row, conflicts)
        return (
            None if best is None else (best[2], best[3]),
            None if finishing is None else (finishing[2], finishing[3]),
        )

    def _prune(self, chosen: list[int], target: int) -> list[int]:
        kept = list(chosen)
        for row in sorted(chosen, key=lambda r: (-self._costs[r], r)):
            trial = [r for r in kept if r != row]
            if self.estimate(trial) <= target:
                kept = trial
        return kept

    def plan_of(self, chosen: Iterable[int]) -> Plan:
        """The Plan for these options, paths in the model's definition order."""
        order = _paths_order(self.trace)
        options = sorted((self.options[row] for row in chosen), key=lambda o: (order.get(o.path, 0), o.span or (0, 0)))
        sequential = [SequentialSegments(o.path, o.segments) for o in options if o.segments is not None]
        spans: dict[str, list[tuple[int, int]]] = {}
        for option in options:
            if option.span is not None:
                spans.setdefault(option.path, []).append(option.span)
        segments: list[Segment] = []
        for path, runs in spans.items():
            container = self.containers[path]
            split = equal_split(len(container.children), runs) if container.called else None
            if split is not None:  # the same plan, applied by checkpoint_sequential's split
                sequential.append(SequentialSegments(path, split))
            else:
                segments.extend(Segment(path, first, last) for first, last in runs)
        return Plan(
            checkpoint=tuple(o.path for o in options if o.segments is None and o.span is None),
            sequential=tuple(sorted(sequential, key=lambda s: order.get(s.module, 0))),
            segments=tuple(segments),
        )

    def recompute_flops(self, chosen: Iterable[int]) -> int:
        return int(sum(self.options[row].flops for row in chosen))

    def recompute_seconds(self, chosen: Iterable[int]) -> float:
        """The search's cost of these options: the roofline time of what reruns."""
        return float(sum(self.options[row].seconds for row in chosen))
