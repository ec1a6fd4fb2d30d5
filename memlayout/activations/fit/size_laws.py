"""One trace, every size: a step's allocations at a size it was not traced at, from its traces at a few others.

A step traced at several sizes of its batch (or sequence) usually runs the same ops in
the same order at each: the same storages are born and freed at the same events, in the
same module calls and phases, and only their bytes differ. Where that holds, each
storage's bytes are a function of the size alone, and the step at another size is the
same events with those bytes: the allocator model replays them as it replays a trace
(`allocator_replay.py`), so the peak, the reserved peak and the figure compared with a
budget follow without tracing.

What is assumed, and checked:
- **The same events.** Every traced size gives the same storages, lifetimes, calls and
  phases (`Structure`); where two differ (a branch on the size, a kernel chosen by it,
  an input small enough to stay real at one size and not at another), nothing is
  evaluated and every size is traced (`SizeLaws.broken` says where they differ).
- **Bytes a polynomial of degree 2 at most.** A tensor's bytes are its element size
  times the product of its dimensions, each of which grows with the size or does not:
  linear in the batch, quadratic in the sequence where attention scores are
  materialized. Each storage's law is fitted through traced sizes and checked at a
  traced size not used to fit it: a line needs three traced sizes, a parabola four.
- **Within one residue class.** A dimension rounded to a multiple (a kernel's padding
  to 32, a window of 512) is a polynomial on each class of sizes modulo that multiple,
  not across them. A size is evaluated only if it lies between the traced sizes and in
  their class modulo the greatest common divisor `g` of their differences, so any such
  multiple that divides `g` is the same at the traced sizes and the evaluated one
  (traces at 512, 2,048 and 4,096: g = 512, and 1,024 or 3,584 are evaluated; 1,000 is
  traced).

What is evaluated is the storages' bytes only: FLOPs and roofline times are not
(they are summed per op, and an op's time is the larger of its compute and memory
times), so an evaluated step's summary carries none, and the budget search, which
prices recomputation with them, runs on a traced step.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from typing import Any, NamedTuple

from memlayout.activations.facts import Trace
from memlayout.activations.summary import Summary, summarize

MIN_SAMPLES = 3
"""Traced sizes needed before any size is evaluated: two fit a line, the third checks it."""


class Structure(NamedTuple):
    """What must be equal between two traces for one to stand for the other at another size: everything but bytes."""

    storages: Any
    """numpy array, one row per storage: born, died (-1: alive at the end), call (-1: none), kind, phase, saved."""
    calls: tuple[tuple[Any, ...], ...]
    """Per call: path, class, parent, recompute, start, end, backward_start, input, output and saved storages."""
    rest: tuple[Any, ...]
    """events, forward_end, the generation's forwards and cache, fallbacks, assumptions, rerun differences."""


def structure(trace: Trace) -> Structure:
    """The trace without its bytes (and FLOPs and times): what two sizes of one step share."""
    import numpy as np

    kinds = {kind: index for index, kind in enumerate(sorted({s.kind.value for s in trace.storages}))}
    phases = {phase: index for index, phase in enumerate(sorted({s.phase.value for s in trace.storages}))}
    rows = np.array(
        [(s.born, -1 if s.died is None else s.died, -1 if s.call is None else s.call, kinds[s.kind.value],
          phases[s.phase.value], int(s.saved)) for s in trace.storages], dtype=np.int64,
    ).reshape(len(trace.storages), 6)
    # The codes are numbered per trace: compare their names too, through the rest.
    calls = tuple((c.path, c.class_name, c.parent, c.recompute, c.start, c.end, c.backward_start, c.input_storages,
                   c.output_storages, c.saved_storages) for c in trace.calls)
    rest = (trace.events, trace.forward_end, tuple(sorted(kinds)), tuple(sorted(phases)), trace.generation,
            trace.fallbacks, trace.assumptions, trace.rerun_state_differs, trace.loss)
    return Structure(rows, calls, rest)


def first_difference(one: Structure, other: Structure) -> str | None:
    """Where two traces' events differ, in words; None where they do not."""
    import numpy as np

    if one.rest[0] != other.rest[0] or len(one.storages) != len(other.storages):
        return f"{len(one.storages):,} storages in {one.rest[0]:,} events against {len(other.storages):,} in " \
               f"{other.rest[0]:,}"
    if not np.array_equal(one.storages, other.storages):
        index = int(np.nonzero((one.storages != other.storages).any(axis=1))[0][0])
        return f"storage {index:,} (born at event {int(one.storages[index][0]):,}) is born, freed or attributed " \
               "differently"
    if one.calls != other.calls:
        index = next(i for i, (a, b) in enumerate(zip(one.calls, other.calls, strict=False)) if a != b) \
            if len(one.calls) == len(other.calls) else min(len(one.calls), len(other.calls))
        return f"module call {index:,} differs" if len(one.calls) == len(other.calls) else \
            f"{len(one.calls):,} module calls against {len(other.calls):,}"
    if one.rest != other.rest:
        names = ("the events", "the end of forward", "the kinds of storage", "the phases", "the generation's forwards",
                 "the fallbacks to real kernels", "the data-dependent ops", "the reruns", "the loss")
        return next(name for name, a, b in zip(names, one.rest, other.rest, strict=True) if a != b) + " differ"
    return None


class Law(NamedTuple):
    """Every storage's bytes as a function of the size: a line for most, a parabola for the few that need one."""

    n0: int
    n1: int
    v0: Any
    """numpy int64 array: the bytes at n0."""
    v1: Any
    """The bytes at n1 (the line runs through n0 and n1)."""
    curved: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]]
    """storage index -> ((n0, n1, n2), (v0, v1, v2)): the parabola through three traced sizes."""


class _Group:
    """Traced sizes whose events agree: one template, and every storage's bytes at each size."""

    def __init__(self, size: int, trace: Trace, shape: Structure) -> None:
        self.template, self.reference = trace, shape
        self.samples: dict[int, Any] = {}
        self.law: Law | None = None
        self.law_for: tuple[int, ...] = ()
        self.unlawful: str | None = None
        """Why no law holds for these sizes (a storage's bytes on no polynomial of degree 2 or less)."""
        self.add(size, trace)

    def add(self, size: int, trace: Trace) -> None:
        import numpy as np

        self.samples[size] = np.fromiter((s.nbytes for s in trace.storages), dtype=np.int64,
                                         count=len(trace.storages))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.samples))

    @property
    def modulus(self) -> int:
        sizes = self.sizes
        return math.gcd(*(size - sizes[0] for size in sizes[1:])) if len(sizes) > 1 else 0

    def current_law(self) -> Law | None:
        sizes = self.sizes
        if self.law_for != sizes:
            self.law, self.law_for = _fitted(self, sizes), sizes
        return self.law

    def covers(self, size: int) -> bool:
        sizes = self.sizes
        if len(sizes) < MIN_SAMPLES or not sizes[0] <= size <= sizes[-1] or (size - sizes[0]) % self.modulus:
            return False
        return self.current_law() is not None


class SizeLaws:
    """The traces of one step at several sizes, and what they say about the sizes between them.

    Traced sizes whose events agree form a group; a size is evaluated from the group whose
    traced sizes surround it. Groups must not interleave: where the events at one size agree
    with those at sizes on both sides of a size whose events differ, the events do not
    change with the size in one place only, and nothing is evaluated.

    Args:
        cuda: Summaries with the CUDA caching allocator's peaks (the step is for a GPU).
    """

    def __init__(self, *, cuda: bool) -> None:
        self.cuda = cuda
        self.groups: list[_Group] = []
        self.broken: str | None = None
        """Why nothing is evaluated: the traced sizes' events change back and forth with the size, or a storage's
        bytes follow no law."""
        self.differs: str | None = None
        """Where two traced sizes' events first differed, in words (the groups' border); None where all agree."""

    def add(self, size: int, trace: Trace) -> None:
        """A trace of the step at `size`: it joins the group whose events it shares, or starts one."""
        if self.broken is not None or size in self.samples:
            return
        shape = structure(trace)
        for group in self.groups:
            if first_difference(group.reference, shape) is None:
                group.add(size, trace)
                group.current_law()  # a storage that follows no law is known now, not when a size is asked for
                break
        else:
            if self.groups:
                nearest = min(self.samples, key=lambda traced: abs(traced - size))
                theirs = self._group_of(nearest).reference
                differs = first_difference(theirs, shape) if nearest < size else first_difference(shape, theirs)
                if self.differs is None:
                    self.differs = f"the step's events differ between {min(nearest, size)} and {max(nearest, size)}: " \
                                   f"{differs}"
            self.groups.append(_Group(size, trace, shape))
        spans = sorted((group.sizes[0], group.sizes[-1]) for group in self.groups)
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            self.broken = (f"the step's events change back and forth with the size (the traces at "
                           f"{', '.join(map(str, self.sizes))} fall in {len(self.groups)} kinds that interleave)")

    def _group_of(self, size: int) -> _Group:
        return next(group for group in self.groups if size in group.samples)

    def same_events(self, size: int, other: int) -> bool:
        """Whether two traced sizes' events agree (False where either was not traced, or the laws are broken)."""
        samples = self.samples
        return self.broken is None and size in samples and other in samples and \
            self._group_of(size) is self._group_of(other)

    @property
    def samples(self) -> dict[int, Any]:
        """size -> numpy int64 array of every storage's bytes there, over every group."""
        return {size: values for group in self.groups for size, values in group.samples.items()}

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.samples))

    @property
    def modulus(self) -> int:
        """The greatest common divisor of the differences between the traced sizes of the largest group: an
        evaluated size is in their class modulo it."""
        return max(self.groups, key=lambda group: len(group.samples)).modulus if self.groups else 0

    @property
    def unlawful(self) -> str | None:
        """Why a group's sizes follow no law, where one does not."""
        return next((group.unlawful for group in self.groups if group.unlawful is not None), None)

    def wants(self, size: int) -> bool:
        """Whether another traced size in the group around `size` could let it be evaluated: the group has too few
        sizes for its laws (three for lines, four where a storage follows a parabola)."""
        if self.broken is not None:
            return False
        group = self.around(size)
        return group is not None and group.unlawful is None and not group.covers(size) and (
            len(group.samples) < MIN_SAMPLES or group.current_law() is None)

    def around(self, size: int) -> _Group | None:
        """The group whose traced sizes surround `size` (or reach nearest to it, where none does)."""
        if not self.groups:
            return None
        for group in self.groups:
            if group.sizes[0] <= size <= group.sizes[-1]:
                return group
        return min(self.groups, key=lambda g: min(abs(size - traced) for traced in g.samples))

    def covers(self, size: int) -> bool:
        """Whether `size` can be evaluated: between traced sizes of one group, in their residue class, with laws
        checked."""
        if self.broken is not None:
            return False
        return any(group.covers(size) for group in self.groups)

    def summary(self, size: int) -> Summary | None:
        """The step's summary at `size`, evaluated: the memory figures of a trace there (its FLOPs and times are
        not evaluated, and are 0). None where `size` is not covered, or a storage's bytes there are not a whole
        number (its law is not the step's)."""
        trace = self.trace_at(size)
        if trace is None:
            return None
        summary = summarize(trace, cuda=self.cuda)
        return dataclasses.replace(summary, forward_flops=0, recompute_flops=0, forward_seconds=0.0,
                                   recompute_seconds=0.0)

    def trace_at(self, size: int) -> Trace | None:
        """The group's events with every storage's bytes at `size` (its calls' FLOPs and times are the template's,
        not evaluated); None where `size` is not covered."""
        if self.broken is not None:
            return None
        group = next((group for group in self.groups if group.covers(size)), None)
        if group is None:
            return None
        law = group.current_law()
        assert law is not None
        nbytes = _evaluate(law, size)
        if nbytes is None:
            return None
        storages = tuple(dataclasses.replace(s, nbytes=int(b))
                         for s, b in zip(group.template.storages, nbytes.tolist(), strict=True))
        return dataclasses.replace(group.template, storages=storages)


def _fitted(group: _Group, sizes: tuple[int, ...]) -> Law | None:
    """Every storage's law, checked at a traced size not used to fit it; None where a storage needs more traced
    sizes (a parabola needs four), or where none of degree 2 or less holds (`group.unlawful` says so)."""
    import numpy as np

    if len(sizes) < MIN_SAMPLES:
        return None
    values = np.stack([group.samples[size] for size in sizes])
    n = np.array(sizes, dtype=np.int64)
    n0, n1 = sizes[0], sizes[-1]
    v0, v1 = values[0], values[-1]
    # On the line through the first and last sizes, exactly: (v - v0)(n1 - n0) == (v1 - v0)(n - n0), in integers
    # (a 7B model's largest storage is under 2**37 bytes and sizes under 2**24: no overflow).
    on_line = ((values - v0) * (n1 - n0) == np.outer(n - n0, v1 - v0)).all(axis=0)
    curved: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {}
    off = np.nonzero(~on_line)[0]
    if len(off):
        if len(sizes) < 4:
            return None
        through = (n0, sizes[len(sizes) // 2], n1)
        for index in off.tolist():
            points = (int(group.samples[through[0]][index]), int(group.samples[through[1]][index]),
                      int(group.samples[through[2]][index]))
            if any(_parabola(through, points, size) != int(group.samples[size][index]) for size in sizes):
                group.unlawful = (f"storage {index:,}'s bytes at {', '.join(map(str, sizes))} follow no polynomial "
                                  "of degree 2 or less")
                return None
            curved[index] = (through, points)
    return Law(n0, n1, v0, v1, curved)


def _evaluate(law: Law, size: int) -> Any:
    """Every storage's bytes at `size`; None where one would not be a whole number of bytes."""
    import numpy as np

    span = law.n1 - law.n0
    rise = (law.v1 - law.v0) * (size - law.n0)
    fractional = rise % span != 0
    if law.curved:
        fractional[np.array(list(law.curved), dtype=np.int64)] = False
    if fractional.any():
        return None
    nbytes = law.v0 + rise // span
    for index, (through, points) in law.curved.items():
        value = _parabola(through, points, size)
        if value.denominator != 1 or value < 0:
            return None
        nbytes[index] = int(value)
    return nbytes


def _parabola(through: tuple[int, ...], points: tuple[int, ...], size: int) -> Fraction:
    """The value at `size` of the polynomial of degree 2 or less through three (size, value) points, exactly."""
    (x0, x1, x2), (y0, y1, y2) = through, points
    d1 = Fraction(y1 - y0, x1 - x0)
    d2 = (Fraction(y2 - y1, x2 - x1) - d1) / (x2 - x0)
    return y0 + d1 * (size - x0) + d2 * (size - x0) * (size - x1)


def sample_sizes(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Which of a sweep's sizes to trace first: the smallest, the largest, and one between them whose distance
    from the smallest shares the fewest divisors with the span (so that the residue class the laws hold in is
    as wide as the sweep's sizes allow), nearest the middle; every size where there are three or fewer."""
    if len(sizes) <= MIN_SAMPLES:
        return sizes
    low, high = sizes[0], sizes[-1]
    middle = (low + high) / 2
    between = sizes[1:-1]
    best = min(between, key=lambda size: (math.gcd(size - low, high - low), abs(size - middle)))
    return (low, high, best)


def next_sample(sizes: tuple[int, ...], traced: tuple[int, ...], laws: SizeLaws) -> int | None:
    """The size to trace next so that more of `sizes` can be evaluated; None where tracing more would not help
    (the laws are broken, or no size left would let another be evaluated)."""
    if laws.broken is not None or laws.unlawful is not None:
        return None
    left = [size for size in sizes if size not in traced and not laws.covers(size)]

    def gain(size: int) -> int:
        # How many of the other sizes left the group around `size` would span, in its residue class, were `size`
        # traced and joined it (a guess: its events may differ, and a parabola needs a fourth size).
        group = laws.around(size)
        points = sorted({*(group.samples if group is not None else ()), size})
        step = math.gcd(*(p - points[0] for p in points[1:])) if len(points) > 1 else 1
        return sum(1 for other in left if other != size and points[0] <= other <= points[-1]
                   and not (other - points[0]) % step)

    if not left:
        return None
    best = max(left, key=lambda size: (gain(size), min(abs(size - t) for t in traced), -size))
    return best if gain(best) else None
