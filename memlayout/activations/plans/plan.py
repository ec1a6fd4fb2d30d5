"""Checkpoint plans: which modules to checkpoint, and how the peak is expected to move.

Pure: a `Planner` reads a baseline `Trace` and proposes plans; it never runs a
model. The search (search.py) traces each proposal again with the plan
applied, and only that trace's peak is reported.

The estimate. Checkpointing one call of a module frees, from the end of its
forward until its backward begins, every storage that was allocated inside it
and saved for backward, except its outputs (the next module holds them). Its
inputs are kept alive until then (checkpoint keeps them to rerun), and when its
backward begins its forward reruns: the saved storages come back, plus the
call's transient temporaries. `checkpoint_sequential` with N segments does the
same for each of its first N-1 segments of children. The live-bytes curve of
the baseline is cut at those event numbers into intervals; each option's effect
is one row of a matrix over the intervals, and a plan's estimated peak is the
maximum of the baseline's interval maxima plus the rows of its options.

The search. Cheapest means least recompute time: the roofline time of what is
rerun on the target (device/roofline.py), each op's FLOPs or the bytes it moves,
whichever binds, so a norm layer, 0 FLOPs to torch's counter, is not free. Options
are taken greedily by estimated peak reduction per second, a module may replace
the options inside it, and options that turn out not to be needed are dropped
again, most expensive first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.activations.facts import ModuleCall, StorageKind, Trace
from memlayout.activations.plans.lowest import conflict_matrix, lowest_options
from memlayout.activations.summary import live_curve, subtree_calls
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
class Plan:
    """What to checkpoint. Paths are dotted module paths from the model."""

    checkpoint: tuple[str, ...] = ()
    """Modules to wrap with `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`."""
    sequential: tuple[SequentialSegments, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.checkpoint and not self.sequential

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": list(self.checkpoint),
            "sequential": [{"module": s.module, "segments": s.segments} for s in self.sequential],
        }

    @classmethod
    def coerce(cls, plan: Plan | Mapping[str, Any]) -> Plan:
        """A Plan, or the `plan` object of a JSON report (extra keys are ignored)."""
        if isinstance(plan, Plan):
            return plan
        if not isinstance(plan, Mapping):
            raise UsageError("a plan is a Plan or a mapping with 'checkpoint' and 'sequential', not "
                             f"{type(plan).__name__}")
        try:
            checkpoint = tuple(str(path) for path in plan.get("checkpoint", ()))
            sequential = tuple(
                SequentialSegments(module=str(item["module"]), segments=int(item["segments"]))
                for item in plan.get("sequential", ())
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"the plan is malformed: {exc}",
                             "pass report.plan or a JSON report's 'plan' object") from exc
        return cls(checkpoint=checkpoint, sequential=sequential)


@dataclass(frozen=True)
class _Gap:
    end: int
    """Freed after this event..."""
    backward_start: int
    """...until this one."""
    freed: int
    kept_inputs: int
    """What checkpoint holds over the gap instead: the call's inputs, and the generator's state on the CPU."""
    rerun_overhead: int
    reruns: bool = True
    """False for a call backward never reaches: checkpoint frees its saved storages and nothing reruns."""


@dataclass(frozen=True)
class Option:
    """One choice: checkpoint a module, or run a Sequential in N segments."""

    path: str
    segments: int | None
    """None for checkpoint(module); N for checkpoint_sequential."""
    flops: int
    """Forward FLOPs rerun in backward."""
    gaps: tuple[_Gap, ...]
    seconds: float = 0.0
    """The roofline time of what reruns in backward, on the target."""

    def conflicts_with(self, other: Option) -> bool:
        """Two options on one module, or on a module and one inside it, do not go together."""
        a, b = self.path, other.path
        return a == b or a == "" or b == "" or a.startswith(b + ".") or b.startswith(a + ".")


def _paths_order(trace: Trace) -> dict[str, int]:
    return {info.path: position for position, info in enumerate(trace.modules)}


class Planner:
    """Estimates plan peaks from a baseline trace and searches for the cheapest plan under a target."""

    def __init__(self, trace: Trace, excluded: Iterable[str] = ()) -> None:
        """`excluded`: module paths that cannot be checkpointed; no option names one."""
        import numpy as np

        self.trace = trace
        self.excluded = frozenset(excluded)
        self.curve = live_curve(trace)
        self.baseline_peak = int(self.curve.max()) if len(self.curve) else 0
        storages = trace.storages
        self._born = np.fromiter((s.born for s in storages), dtype=np.int64, count=len(storages))
        freeable = np.fromiter(
            (s.nbytes if s.saved and s.kind is StorageKind.STEP else 0 for s in storages),
            dtype=np.int64, count=len(storages),
        )
        self._freeable_prefix = np.concatenate(([0], np.cumsum(freeable)))
        self._freeable = freeable
        self._inside = subtree_calls(trace)
        self.options = self._options()
        self._build_matrix()
        self._lowest: list[int] | None = None

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
            reached = [(call, gap) for call in calls for gap in self._gaps(call, call)]
            # Checkpointing the whole model frees nothing before its backward begins.
            if info.path and any(gap.freed > gap.kept_inputs for _, gap in reached):
                rerun = [trace.calls[i] for call, gap in reached if gap.reruns for i in self._inside[call.id]]
                options.append(Option(info.path, None, sum(c.flops for c in rerun), tuple(gap for _, gap in reached),
                                      sum(c.seconds for c in rerun)))
            if info.sequential_children and len(info.sequential_children) >= 2:
                options.extend(self._sequential_options(info.path, info.sequential_children, calls))
        return options

    def _sequential_options(self, path: str, children: Sequence[str], calls: list[ModuleCall]) -> list[Option]:
        trace = self.trace
        if any(child in self.excluded for child in children):
            return []  # a segment reruns its children
        runs: list[list[ModuleCall]] = []
        for call in calls:
            inner = [c for c in trace.calls if c.parent == call.id and not c.recompute]
            if [c.path for c in inner] != list(children):
                return []  # not a plain Sequential run (children skipped, repeated or reordered)
            runs.append(inner)
        options: list[Option] = []
        count = len(children)
        for segments in range(2, count + 1):
            size = count // segments
            gaps: list[_Gap] = []
            rerun: list[ModuleCall] = []
            for run in runs:
                for first in range(0, size * (segments - 1), size):
                    chunk = run[first : first + size]
                    found = self._gaps(chunk[0], chunk[-1])  # none for a run under no_grad
                    gaps.extend(found)
                    if any(gap.reruns for gap in found):
                        rerun.extend(trace.calls[i] for c in chunk for i in self._inside[c.id])
            if any(g.freed > g.kept_inputs for g in gaps):
                options.append(Option(path, segments, sum(c.flops for c in rerun), tuple(gaps),
                                      sum(c.seconds for c in rerun)))
        return options

    def _gaps(self, first: ModuleCall, last: ModuleCall) -> tuple[_Gap, ...]:
        """The effect of checkpointing the calls from `first` to `last` (one call, or a segment)."""
        import numpy as np

        trace = self.trace
        starts = [trace.calls[i].backward_start for c in self._span(first, last) for i in self._inside[c.id]]
        known = [s for s in starts if s is not None]
        if not known:
            return self._unreached_gaps(first, last)
        backward_start = min(known)
        start, end = first.start, last.end
        low = int(np.searchsorted(self._born, start, side="right"))
        high = int(np.searchsorted(self._born, end, side="right"))
        freed = int(self._freeable_prefix[high] - self._freeable_prefix[low])
        outputs = last.output_storages
        freed -= sum(int(self._freeable[i]) for i in outputs if low <= i < high)
        kept_inputs = sum(
            trace.storages[i].nbytes
            for i in first.input_storages
            if trace.storages[i].kind is StorageKind.STEP
            and trace.storages[i].died is not None
            and (trace.storages[i].died or 0) <= backward_start
        )
        growth = int(self.curve[start : end + 1].max() - self.curve[start]) if end >= start else 0
        # checkpoint keeps the generator's state from forward to the rerun, whose fork takes one more.
        rng = trace.rng_state_bytes
        return (_Gap(end, backward_start, max(freed, 0), kept_inputs + rng, max(growth - max(freed, 0), 0) + rng),)

    def _unreached_gaps(self, first: ModuleCall, last: ModuleCall) -> tuple[_Gap, ...]:
        """The effect of checkpointing calls that backward never reaches, though autograd saved for them.

        Their graph lives while something holds their output: an encoder's output
        returned beside the loss that does not depend on it (an encoder-decoder whose
        decoder has no cross-attention) keeps everything its graph saved until the
        output is dropped, over the end of forward, where the peak often is.
        Checkpointed, the call saves placeholders instead, and backward never asks
        for a rerun. One gap per moment such storages die, each freeing those.
        Under no_grad nothing is saved and there is nothing to free.
        """
        trace = self.trace
        storages = trace.storages
        outputs = set(last.output_storages)
        dies: dict[int, int] = {}
        for c in self._span(first, last):
            for call in self._inside[c.id]:
                for i in trace.calls[call].saved_storages:
                    died = storages[i].died or trace.events
                    if storages[i].kind is StorageKind.STEP and i not in outputs and died > last.end:
                        dies[i] = died
        if not dies:
            return ()
        until = max(dies.values())
        # checkpoint holds the inputs until the graph (the last of these storages) goes.
        kept_inputs = sum(
            storages[i].nbytes
            for i in first.input_storages
            if storages[i].kind is StorageKind.STEP and (storages[i].died or trace.events + 1) <= until
        )
        freed: dict[int, int] = {}
        for i, died in dies.items():
            freed[died] = freed.get(died, 0) + storages[i].nbytes
        kept_inputs += trace.rng_state_bytes  # the generator's state, kept with the inputs
        return tuple(
            _Gap(last.end, died, nbytes, kept_inputs if died == until else 0, 0, reruns=False)
            for died, nbytes in sorted(freed.items())
        )

    def _span(self, first: ModuleCall, last: ModuleCall) -> list[ModuleCall]:
        if first.id == last.id:
            return [first]
        return [c for c in self.trace.calls if c.parent == first.parent and first.id <= c.id <= last.id]

    # the estimate -------------------------------------------------------------
    def _build_matrix(self) -> None:
        import numpy as np

        events = self.trace.events
        cuts = {0}
        for option in self.options:
            for gap in option.gaps:
                cuts.update(point + 1 for point in (gap.end, gap.backward_start) if point + 1 <= events)
        # Interval j holds events starts[j] .. starts[j+1]-1; a gap (end, backward_start] is whole intervals.
        starts = np.array(sorted(cuts), dtype=np.int64)
        self._interval_max = np.maximum.reduceat(self.curve, starts) if len(self.curve) else np.zeros(1, np.int64)
        width = len(starts)

        def interval(event: int) -> int:
            return int(np.searchsorted(starts, event)) if event <= events else width

        self._rows = np.zeros((len(self.options), width), dtype=np.int64)
        for row, option in enumerate(self.options):
            for gap in option.gaps:
                first, last = interval(gap.end + 1), interval(gap.backward_start + 1)
                self._rows[row, first:last] -= gap.freed - gap.kept_inputs
                if last < width:
                    self._rows[row, last] += gap.rerun_overhead
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

    def lowest(self) -> list[int]:
        """The options of the lowest estimated peak this planner reaches (a beam search: plans/lowest.py), from
        the empty plan and, apart, from the covers. Searched once: a search asks for it again each round."""
        if self._lowest is None:
            rows, peak = lowest_options(self._interval_max, self._rows, self._costs, self._conflicts,
                                        seeds=self.covers())
            self._lowest = self._prune(rows, peak)
        return list(self._lowest)

    def covers(self, budget: int | None = None) -> list[list[int]]:
        """Plans that checkpoint every module of one level: the shallowest modules, and the deepest.

        The estimate adds options one at a time, so it can miss what several do
        together: in a stack of residual blocks, checkpointing one block moves the
        peak to its rerun, where one more block alone gains nothing, yet checkpointing
        every block lowers the peak further (measured: 39.6 MiB for one block, 37.6 MiB
        for all eight, tests/activations/plans/test_plan.py). These plans are traced too before a budget is called
        unreachable, less, with `budget`, those estimated at over COVER_SKIP times it: every figure compared
        with a budget is at least the live peak, and no estimate has run that far over it."""
        singles = [row for row, option in enumerate(self.options) if option.segments is None]
        found: list[list[int]] = []
        for deepest_first in (False, True):
            ordered = sorted(singles, key=lambda row: self.options[row].path.count("."), reverse=deepest_first)
            chosen: list[int] = []
            for row in ordered:
                if not any(self._conflicting[row][other] for other in chosen):
                    chosen.append(row)
            if (chosen and sorted(chosen) not in found
                    and (budget is None or self.estimate(chosen) <= COVER_SKIP * budget)):
                found.append(sorted(chosen))
        return found

    def _applied(self, chosen: list[int], move: tuple[int, list[int]]) -> list[int]:
        add, remove = move
        return [row for row in chosen if row not in remove] + [add]

    def _apply(self, chosen: list[int], values: np.ndarray, move: tuple[int, list[int]]) -> tuple[list[int], np.ndarray]:  # noqa: E501  (a split takes plan.py past its 450 lines)
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
        options = sorted((self.options[row] for row in chosen), key=lambda o: order.get(o.path, 0))
        return Plan(
            checkpoint=tuple(o.path for o in options if o.segments is None),
            sequential=tuple(SequentialSegments(o.path, o.segments) for o in options if o.segments is not None),
        )

    def recompute_flops(self, chosen: Iterable[int]) -> int:
        return int(sum(self.options[row].flops for row in chosen))

    def recompute_seconds(self, chosen: Iterable[int]) -> float:
        """The search's cost of these options: the roofline time of what reruns."""
        return float(sum(self.options[row].seconds for row in chosen))
