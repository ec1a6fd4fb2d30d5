"""The size search's bracket: where the largest fitting size lies, and the next size it probes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memlayout.activations.fit.bracket import MAX_SIZE, Bracket, largest_fitting
from memlayout.activations.fit.probes import FitProbe


def plain(size: int, peak: int, budget: int) -> FitProbe:
    """A probe of the plain step: its traced peak, compared with the budget."""
    return FitProbe(size, False, peak, peak <= budget)


def test_the_bracket_grows_by_doubling_until_a_size_does_not_fit_then_closes() -> None:
    bracket = Bracket(budget=100)
    assert bracket.first(3) == 3
    bracket.record(3, plain(3, 30, 100))
    assert (bracket.low, bracket.high, bracket.closed) == (3, None, False)
    # One traced point: no line yet, so it doubles.
    assert bracket.next_size() == 6
    bracket.record(6, plain(6, 60, 100))
    # Two points on a line through (3, 30) and (6, 60): the budget is reached at 10.
    assert bracket.next_size() == 10
    bracket.record(10, plain(10, 100, 100))
    assert bracket.next_size() == 11
    bracket.record(11, plain(11, 110, 100))
    assert (bracket.low, bracket.high, bracket.closed) == (10, 11, True)


def test_twice_the_line_fails_to_halve_the_bracket_and_it_bisects() -> None:
    bracket = Bracket(budget=1000, known_fit=1, anchor=(0, 0))
    bracket.record(2, plain(2, 10, 1000))
    bracket.record(100, plain(100, 2000, 1000))  # the bracket (2, 100)
    assert not bracket.bisecting
    for size in (96, 92):  # a peak that curves: each step off the line leaves most of the bracket
        bracket.record(size, plain(size, 1500, 1000))
        bracket.next_size()
    assert bracket.slow == 2 and bracket.bisecting
    assert bracket.next_size() == (bracket.low + bracket.high) // 2


def test_a_floor_aims_the_first_probe_where_its_line_reaches_the_budget() -> None:
    bracket = Bracket(budget=1000, known_fit=4, anchor=(0, 100), floor=(80, 900))
    assert bracket.line == 90  # from (0, 100) through (80, 900) to 1000
    assert bracket.first(5) == 90
    bracket.record(90, FitProbe(90, True, 990, True))  # a planned probe that fits: the line learns nothing
    assert bracket.next_size() == 91  # the size after the crossing, once
    bracket.record(91, FitProbe(91, True, 995, True))
    assert bracket.next_size() == 182  # then doubling


def test_the_cap_closes_a_bracket_that_never_stops_fitting() -> None:
    bracket = Bracket(budget=10, cap=8)
    bracket.record(8, plain(8, 1, 10))
    assert bracket.closed and bracket.low == 8
    assert largest_fitting(lambda n: plain(n, 1, 10), 1, budget=10, cap=MAX_SIZE) == MAX_SIZE


@given(answer=st.integers(0, 5000), start=st.integers(1, 64), quadratic=st.booleans())
@settings(max_examples=200, deadline=None)
def test_the_search_finds_the_largest_size_that_fits_in_few_probes(answer: int, start: int, quadratic: bool) -> None:
    """Any peak that grows with the size: the answer is the last size within the budget, found within the probes
    growth by doubling and plain bisection would take, plus two."""
    budget = 10**9

    def peak(n: int) -> int:
        grown = n * n if quadratic else n
        limit = answer * answer if quadratic else answer
        return budget * grown // max(limit, 1) if answer else budget + n

    probed: list[int] = []

    def probe(n: int) -> FitProbe:
        probed.append(n)
        return plain(n, peak(n), budget)

    found = largest_fitting(probe, start, anchor=(0, 0), budget=budget)
    assert found == answer
    assert len(set(probed)) == len(probed)  # no size is probed twice
    bound = max(answer, start, 1)
    assert len(probed) <= 2 * bound.bit_length() + 4
