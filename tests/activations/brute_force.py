"""Every plan of a space small enough to run each for real: the reference the plan search is held to.

The space: for each container named (a Sequential the model calls, or a ModuleList it iterates), every
segmentation (every set of disjoint runs of two or more of its children that the model runs one after
another), taken together with every set of at most `max_modules` of the modules named, where they do not
overlap. Which plans exist is read off memlayout's baseline trace (which modules ran, which runs chain);
what each plan peaks at is measured on a real CPU step by the allocator's own events
(measure.allocator_peak_step), never by memlayout.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import memlayout.activations as act
from memlayout.activations.plans.plan import Plan, Segment
from memlayout.activations.plans.segments import Container, containers
from tests.activations.measure import allocator_peak_step


@dataclass(frozen=True)
class Space:
    """What a brute force enumerates on one model."""

    containers: tuple[str, ...]
    """The containers whose every segmentation is taken."""
    modules: Callable[[str], bool]
    """Which modules may be checkpointed on their own."""
    max_modules: int
    within: int | None = None
    """Runs among the first this many children only (None: all of them)."""


def segmentations(container: Container, within: int | None = None) -> list[tuple[Segment, ...]]:
    """Every set of disjoint runs of two or more children (of the first `within`) that the container runs as a
    chain."""
    count = len(container.children) if within is None else within

    def from_child(start: int) -> Iterator[tuple[Segment, ...]]:
        if start >= count:
            yield ()
            return
        yield from from_child(start + 1)  # child `start` in no run
        for last in range(start + 1, count):
            if container.run(start, last) is None:
                continue
            for rest in from_child(last + 1):
                yield (Segment(container.path, start, last), *rest)

    return list(from_child(0))


def plans(model: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any], space: Space) -> list[Plan]:
    """Every plan of the space, the empty plan included."""
    trace = act.analyze(model, list(args), kwargs=kwargs).trace
    found = {c.path: c for c in containers(trace, frozenset())}
    per_container = [segmentations(found[path], space.within) for path in space.containers]
    called = list(dict.fromkeys(c.path for c in trace.calls if not c.recompute and c.path and space.modules(c.path)))
    result: list[Plan] = []
    for choice in itertools.product(*per_container):
        segments = tuple(s for chosen in choice for s in chosen)
        covered = [found[s.module].children[s.first : s.last + 1] for s in segments]
        free = [p for p in called if not any(_nested(p, child) for run in covered for child in run)]
        for size in range(space.max_modules + 1):
            for modules in itertools.combinations(free, size):
                if any(_nested(a, b) for a, b in itertools.combinations(modules, 2)):
                    continue
                result.append(Plan(checkpoint=modules, segments=segments))
    return result


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def real_peak(build: Callable[[], torch.nn.Module], args: Sequence[Any], kwargs: dict[str, Any], plan: Any, *,
              one_thread: bool = True) -> int:
    """The peak of a real CPU step (AdamW, steady state) with the plan applied, by the allocator's events.

    On one thread unless `one_thread` is False: on a busy 2-core machine two threads spin for four times the CPU
    of one, and the peaks are the same but for a convolution's scratch per thread (29,952 B more on two threads on
    the brute force's CNN), so plans are compared with each other on one thread, and a plan is held to a budget
    on torch's own count, as users run it."""
    model = build()
    threads = torch.get_num_threads()
    if one_thread:
        torch.set_num_threads(1)
    try:
        with act.apply_plan(model, plan):
            return allocator_peak_step(model, tuple(args), kwargs).peak_bytes
    finally:
        torch.set_num_threads(threads)


def lowest(build: Callable[[], torch.nn.Module], args: Sequence[Any], kwargs: dict[str, Any],
           space: Space) -> tuple[Plan, int, int]:
    """(the plan of the lowest real peak, that peak, how many plans were run)."""
    every = plans(build(), args, kwargs, space)
    measured = [(real_peak(build, args, kwargs, plan), plan) for plan in every]
    peak, plan = min(measured, key=lambda item: item[0])
    return plan, peak, len(every)
