"""Segment options: runs of a container's children checkpointed as one, found in the baseline trace.

Checkpointing one child of a plain stack saves nothing where each child saves only its input, which the
child before it made and the one after holds anyway: a Sequential CNN of six conv/norm/ReLU blocks peaks
at 154.5 MB with any one child checkpointed, as without a plan. A run of children checkpointed together
frees everything saved between its first input and its last output, and reruns all of it at once in
backward: which runs to take, how many and where they end, is the choice. `checkpoint_sequential` takes
N equal runs and leaves the last unchecked; the planner also offers each run on its own, so that its
searches choose the number and the boundaries.

Two kinds of container:
- an nn.Sequential the model calls, whose forward runs its children in order: apply_plan replaces that
  forward with one that checkpoints the runs (plans/apply_segments.py);
- a container the model iterates without calling it (an nn.ModuleList of blocks): a run is offered where,
  in every pass of the model over it, its children ran one right after another, each fed the output of
  the one before, with nothing allocated between them: then checkpointing the run from the first child's
  call to the last child's return, and rerunning the children one after another, replays what forward did.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memlayout.activations.facts import ModuleCall, Trace
from memlayout.activations.plans.options import Gap, Option

if TYPE_CHECKING:
    import numpy as np

MAX_SPANS = 256
"""Runs offered per container at most: the shortest first (a run of two children, then three...), every run of
each length taken whole. A 21-child Sequential has 210 runs of two or more children, all offered; an 80-block
ModuleList gets its runs of up to four blocks (234), where a transformer block saves many times its input and
runs of one block (the block checkpointed) are the ones that count."""

GapsOf = Callable[[ModuleCall, ModuleCall], tuple[Gap, ...]]
"""The planner's effect of checkpointing the calls from a first to a last sibling (Planner._gaps)."""


@dataclass(frozen=True)
class Container:
    """A module whose children run as a stack, and the runs of them the planner may checkpoint."""

    path: str
    children: tuple[str, ...]
    called: bool
    """An nn.Sequential the model calls (its forward replaced); False for a container the model iterates."""
    passes: tuple[tuple[tuple[int, ModuleCall], ...], ...]
    """Each pass of the model over the children: (child index, its call), in the order they ran."""
    links: frozenset[tuple[int, int]]
    """(pass, position) where the call at `position` fed the next one of the pass, with nothing between."""

    def run(self, first: int, last: int) -> list[tuple[ModuleCall, ModuleCall]] | None:
        """(first call, last call) of children first..last in each pass that runs them; None where some pass
        does not run them one after another, each once, each fed the one before."""
        runs = []
        for number, calls in enumerate(self.passes):
            positions = [p for p, (index, _) in enumerate(calls) if first <= index <= last]
            if not positions:
                continue
            start = positions[0]
            if [calls[p][0] for p in positions] != list(range(first, last + 1)) or positions[-1] - start != last - first:
                return None
            if any((number, p) not in self.links for p in positions[:-1]):
                return None
            runs.append((calls[positions[0]][1], calls[positions[-1]][1]))
        return runs or None


def containers(trace: Trace, excluded: frozenset[str]) -> list[Container]:
    """The Sequentials the model calls and the containers it iterates, with two or more children."""
    import numpy as np

    born = np.fromiter((s.born for s in trace.storages), dtype=np.int64, count=len(trace.storages))
    forward = [c for c in trace.calls if not c.recompute]
    siblings: dict[int | None, list[ModuleCall]] = {}
    for call in forward:
        siblings.setdefault(call.parent, []).append(call)
    next_sibling = {a.id: b.id for calls in siblings.values() for a, b in itertools.pairwise(calls)}
    called = {c.path for c in forward}
    children_of: dict[str, list[str]] = {}
    for info in trace.modules:
        if info.path:
            parent, _, _ = info.path.rpartition(".")
            children_of.setdefault(parent, []).append(info.path)
    found: list[Container] = []
    for info in trace.modules:
        children = tuple(children_of.get(info.path, ()))
        if len(children) < 2 or info.path in excluded:
            continue
        index = {path: i for i, path in enumerate(children)}
        passes: list[tuple[tuple[int, ModuleCall], ...]] = []
        if info.sequential_children is not None and info.path in called:
            if tuple(info.sequential_children) != children:
                continue
            for call in (c for c in forward if c.path == info.path):
                inner = siblings.get(call.id, [])
                if [c.path for c in inner] != list(children):
                    passes = []
                    break  # not a plain Sequential run (children skipped, repeated or reordered)
                passes.append(tuple((index[c.path], c) for c in inner))
            sequential = True
        elif info.path not in called and info.path:
            for calls in siblings.values():
                run = tuple((index[c.path], c) for c in calls if c.path in index)
                if run:
                    passes.append(run)
            sequential = False
        else:
            continue
        if not passes:
            continue
        links = frozenset(
            (number, position)
            for number, run in enumerate(passes)
            for position in range(len(run) - 1)
            if _fed(run[position][1], run[position + 1][1], next_sibling, born)
        )
        found.append(Container(info.path, children, sequential, tuple(passes), links))
    return found


def _fed(before: ModuleCall, after: ModuleCall, next_sibling: dict[int, int], born: np.ndarray) -> bool:
    """`after` ran right after `before`, fed its output, and nothing was allocated between the two."""
    import numpy as np

    if next_sibling.get(before.id) != after.id:
        return False
    between = int(np.searchsorted(born, after.start, side="right") - np.searchsorted(born, before.end, side="right"))
    return between == 0 and bool(set(after.input_storages) & set(before.output_storages))


def span_options(container: Container, excluded: frozenset[str], in_place: frozenset[str], gaps_of: GapsOf,
                 rerun_calls: Callable[[ModuleCall, ModuleCall], Iterable[ModuleCall]]) -> list[Option]:
    """Every run of two or more children, the shortest first, up to MAX_SPANS, that frees something.

    `in_place`: the modules that write into a tensor they received (excluded on their own, as their rerun
    would start from the changed values); inside a run, past its first child, they write into what the run
    made, which its rerun makes again (torchvision's VGG: ReLU(inplace=True) after every convolution)."""
    count = len(container.children)
    options: list[Option] = []
    offered = 0
    for length in range(2, count + 1):
        if offered + count - length + 1 > MAX_SPANS:
            break
        offered += count - length + 1
        for first in range(count - length + 1):
            last = first + length - 1
            covers = container.children[first : last + 1]
            if not _may_checkpoint(covers, excluded, in_place):
                continue
            runs = container.run(first, last)
            if runs is None:
                continue
            gaps: list[Gap] = []
            rerun: list[ModuleCall] = []
            for start, end in runs:
                found = gaps_of(start, end)
                gaps.extend(found)
                if any(gap.reruns for gap in found):
                    rerun.extend(rerun_calls(start, end))
            if any(g.freed > g.kept_inputs for g in gaps):
                options.append(Option(container.path, None, sum(c.flops for c in rerun), tuple(gaps),
                                      sum(c.seconds for c in rerun), span=(first, last), covers=covers))
    return options


def equal_split_options(container: Container, excluded: frozenset[str], in_place: frozenset[str], gaps_of: GapsOf,
                        rerun_calls: Callable[[ModuleCall, ModuleCall], Iterable[ModuleCall]]) -> list[Option]:
    """`checkpoint_sequential(module, N, input)` for each N: N runs of len // N children, all but the last
    checkpointed (the last takes the rest)."""
    if not container.called:
        return []
    options: list[Option] = []
    count = len(container.children)
    for segments in range(2, count + 1):
        size = count // segments
        runs = [container.children[first : first + size] for first in range(0, size * (segments - 1), size)]
        if not all(_may_checkpoint(run, excluded, in_place) for run in runs):
            continue  # a segment reruns its children
        gaps: list[Gap] = []
        rerun: list[ModuleCall] = []
        for calls in container.passes:
            for first in range(0, size * (segments - 1), size):
                start, end = calls[first][1], calls[first + size - 1][1]
                found = gaps_of(start, end)  # none for a run under no_grad
                gaps.extend(found)
                if any(gap.reruns for gap in found):
                    rerun.extend(rerun_calls(start, end))
        if any(g.freed > g.kept_inputs for g in gaps):
            options.append(Option(container.path, segments, sum(c.flops for c in rerun), tuple(gaps),
                                  sum(c.seconds for c in rerun)))
    return options


def _may_checkpoint(children: tuple[str, ...], excluded: frozenset[str], in_place: frozenset[str]) -> bool:
    """No child excluded, but one past the first that is excluded only for writing into what it received."""
    return children[0] not in excluded and all(c not in excluded or c in in_place for c in children[1:])


def equal_split(count: int, spans: list[tuple[int, int]]) -> int | None:
    """N where these runs are `checkpoint_sequential`'s split of `count` children into N; None where they are not."""
    segments = len(spans) + 1
    size = count // segments
    expected = [(first, first + size - 1) for first in range(0, size * (segments - 1), size)]
    return segments if size >= 1 and sorted(spans) == expected else None
