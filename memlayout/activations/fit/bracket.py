"""`--fit`'s search over sizes: a bracket between the largest size known to fit and the smallest known not to.

The bracket grows from the size given (doubling) until a probe does not fit, then
narrows. Each next size comes from the straight line through the two traced figures
nearest the budget (`Bracket.next_size`), since a step's peak grows nearly linearly with
its batch; once that has twice failed to halve the bracket, it bisects, so it never takes
more probes than plain bisection after growth by doubling would, plus two. The probe is
assumed to fit at every size below one that fits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memlayout.activations.fit.probes import FitProbe

MAX_SIZE = 1 << 24
"""The search stops growing here: a model whose step fits this many samples or tokens fits more than anyone asks."""


class Bracket:
    """Where the largest fitting size lies: above `low` (fits; 0: none known) and below `high` (does not; None:
    none found yet), with the figures traced on the way.

    `anchor`, a size and figure known without a probe (the model's own state at size 0),
    stands in for the line's second point at first. `floor`, a size and a traced figure on
    the line a planned step's lowest figure grows along (the planner's lowest plan, traced
    far above the answer), draws the first line with the anchor: the first probe is where
    that line reaches the budget. While every probe fits, the search then checks the size
    after the line's crossing once, and doubles after that: a planned probe that fits
    traces no floor, so the line cannot learn from it.
    """

    def __init__(self, budget: int, *, known_fit: int = 0, anchor: tuple[int, int] | None = None,
                 floor: tuple[int, int] | None = None, cap: int = MAX_SIZE) -> None:
        self.budget, self.cap = budget, cap
        self.low = known_fit
        self.high: int | None = None
        self.traced: dict[int, int] = {} if anchor is None else {anchor[0]: anchor[1]}
        """size -> a traced figure (the anchor's is known)."""
        self.estimated: dict[int, int] = {}
        """size -> an estimated one (a plan found: see FitProbe.guide): steers the growth, and only until a size
        does not fit."""
        self.line = None if floor is None or anchor is None else _reach(anchor, floor, budget)
        """Where the line from the anchor through the floor reaches the budget; None without a floor."""
        if floor is not None:
            self.traced[floor[0]] = floor[1]
        self.past_line = False
        self.slow = 0
        """How many narrowings in a row the line failed to halve the bracket."""
        self.bisecting = False
        self.ahead = False
        """The last probe's estimate was at or over the budget where a plan was found to fit."""

    def first(self, start: int) -> int:
        """The first size to probe: where the floor's line reaches the budget, else `start`."""
        return min(max(self.line if self.line is not None else start, self.low + 1, 1), self.cap)

    def record(self, size: int, result: FitProbe) -> None:
        """A probe's answer at `size`: the bracket moves, and its figure joins the line's points."""
        # An estimate at or over the budget where a plan was found to fit is contradicted by the trace: the
        # estimates run ahead of the step.
        self.ahead = bool(result.fits and not result.guide_measured and result.guide is not None
                          and result.guide >= self.budget)
        if result.guide is not None and not self.ahead:
            (self.traced if result.guide_measured else self.estimated)[size] = result.guide
        width = None if self.high is None else self.high - self.low
        if result.fits:
            self.low = size
        else:
            self.high = size
        if self.high is not None:
            self.slow = self.slow + 1 if width is not None and self.high - self.low > width // 2 else 0

    @property
    def closed(self) -> bool:
        """Whether `low` is the answer: the bracket is one wide, or nothing stopped the growth below the cap."""
        if self.high is None:
            return self.low >= self.cap
        return self.high - self.low <= 1

    def next_size(self) -> int:
        """The size to probe next, inside the bracket (or above it while growing)."""
        points = self.traced if self.high is not None else {**self.estimated, **self.traced}
        guess = _crossing(points, self.low, self.high, self.budget)
        return self._grown(guess) if self.high is None else self._narrowed(guess)

    def _grown(self, guess: int | None) -> int:
        low, grown = self.low, max(2 * self.low, self.low + 1)
        if self.line is not None:
            size = min(self.cap, grown if self.past_line else low + 1)
            self.past_line = True
            return size
        if self.ahead:  # on the estimates below it the search would crawl (the 1.1B Llama in float32 on an
            guess = None  # A100 40GB probed 9, 10, ..., 17): double instead
        return min(self.cap, max(low + 1, min(guess, 16 * grown) if guess is not None else grown))

    def _narrowed(self, guess: int | None) -> int:
        assert self.high is not None
        # Twice the line did not halve the bracket: the peak curves away from it (a peak quadratic in the
        # sequence), so the search bisects from here on.
        self.bisecting = self.bisecting or self.slow >= 2
        if guess is None or self.bisecting:
            return (self.low + self.high) // 2
        return min(max(guess, self.low + 1), self.high - 1)


def largest_fitting(
    probe: Callable[[int], FitProbe], start: int, *, known_fit: int = 0, anchor: tuple[int, int] | None = None,
    floor: tuple[int, int] | None = None, budget: int, cap: int = MAX_SIZE,
) -> int:
    """The largest n in [1, cap] whose probe fits, or `known_fit` (0: none known) when none above it does; see
    `Bracket` for the search and its `anchor` and `floor`."""
    bracket = Bracket(budget, known_fit=known_fit, anchor=anchor, floor=floor, cap=cap)
    size = bracket.first(start)
    while True:
        bracket.record(size, probe(size))
        if bracket.closed:
            return bracket.low
        size = bracket.next_size()


def _crossing(peaks: dict[int, int], low: int, high: int | None, budget: int) -> int | None:
    """The size where the line through the two probed peaks nearest the budget reaches it (rounded down),
    and one more when that is the size known to fit: the next probe checks it."""
    below = sorted(n for n in peaks if n <= low)
    above = sorted(n for n in peaks if high is not None and n >= high)
    pair = (below[-1], above[0]) if below and above else tuple(below[-2:]) if len(below) >= 2 else None
    if pair is None:
        return None
    (n1, p1), (n2, p2) = ((n, peaks[n]) for n in pair)
    guess = _reach((n1, p1), (n2, p2), budget)
    if guess is None:
        return None
    return guess + 1 if guess <= low else guess


def _reach(first: tuple[int, int], second: tuple[int, int], budget: int) -> int | None:
    """The size (rounded down) where the line through two (size, figure) points reaches the budget; None where
    the line does not rise."""
    (n1, p1), (n2, p2) = first, second
    if p2 <= p1 or n2 == n1:
        return None
    return n1 + (budget - p1) * (n2 - n1) // (p2 - p1)
