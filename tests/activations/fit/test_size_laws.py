"""Size laws: a step's storages at a size between traced ones, built from traces made by hand.

Each case is a step of a few storages whose bytes follow a known function of the size; what
the laws evaluate is compared with that function's own trace at the size, storage by storage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from memlayout.activations.facts import (
    ModuleCall,
    ModuleInfo,
    Phase,
    StorageKind,
    StorageLife,
    Trace,
)
from memlayout.activations.fit.size_laws import SizeLaws, next_sample, sample_sizes
from memlayout.activations.summary import summarize

Law = Callable[[int], int]


def step(laws: list[Law], size: int, *, extra: bool = False) -> Trace:
    """A step whose storage i holds laws[i](size) bytes: the first is a parameter, the rest are born in forward, each
    freed two events after the next is born; `extra` adds a storage (another kernel's scratch, say)."""
    storages = [StorageLife(laws[0](size), StorageKind.PARAMETER, 1, None, None, Phase.SETUP, False)]
    event = 1
    for law in laws[1:] + ([lambda n: 64] if extra else []):
        event += 1
        storages.append(StorageLife(law(size), StorageKind.STEP, event, None, 0, Phase.FORWARD, False))
    events = event
    for index in range(1, len(storages) - 1):
        events += 1
        storages[index] = dataclasses.replace(storages[index], died=events)
    call = ModuleCall(0, "", "Model", None, False, 1, events, None, (), (), (), 0, False, False, False, False)
    return Trace(tuple(storages), (call,), (ModuleInfo("", "Model", None),), events, events, "sum", 0, "cpu",
                 "fake", ())


def laws_of(laws: list[Law], traced: tuple[int, ...]) -> SizeLaws:
    found = SizeLaws(cuda=False)
    for size in traced:
        found.add(size, step(laws, size))
    return found


def bytes_at(found: SizeLaws, size: int) -> list[int] | None:
    trace = found.trace_at(size)
    return None if trace is None else [s.nbytes for s in trace.storages]


LINEAR: list[Law] = [lambda n: 4096, lambda n: 512 * n, lambda n: 3 * n + 7, lambda n: 1024]


def test_a_size_between_three_traced_ones_is_the_trace_there_to_the_byte() -> None:
    found = laws_of(LINEAR, (2, 5, 9))
    for size in (3, 4, 6, 7, 8):
        assert found.covers(size)
        assert bytes_at(found, size) == [law(size) for law in LINEAR]
        evaluated, traced = found.summary(size), summarize(step(LINEAR, size))
        assert evaluated is not None and (evaluated.peak_bytes, evaluated.at_peak) == (traced.peak_bytes,
                                                                                        traced.at_peak)


def test_nothing_is_evaluated_outside_the_traced_sizes_or_from_two_of_them() -> None:
    assert not laws_of(LINEAR, (2, 9)).covers(5)  # two sizes fit a line and leave nothing to check it
    found = laws_of(LINEAR, (2, 5, 9))
    assert not found.covers(1) and not found.covers(10)  # never extrapolated
    assert found.trace_at(10) is None


def test_a_parabola_is_evaluated_once_a_fourth_size_checks_it() -> None:
    attention: list[Law] = [lambda n: 4096, lambda n: 4 * n * n, lambda n: 8 * n]  # scores are seq x seq
    found = laws_of(attention, (16, 40, 64))
    assert not found.covers(32) and found.wants(32)
    found.add(32, step(attention, 32))
    assert found.modulus == 8 and found.covers(24) and bytes_at(found, 24) == [law(24) for law in attention]


def test_a_cube_follows_no_law_and_nothing_is_evaluated() -> None:
    cubic: list[Law] = [lambda n: 4096, lambda n: n ** 3]
    found = laws_of(cubic, (2, 3, 6, 8, 10))
    assert not found.covers(5) and found.unlawful is not None and "degree 2" in found.unlawful
    assert next_sample((2, 3, 4, 5, 6, 7, 8, 9, 10), (2, 3, 6, 8, 10), found) is None


def test_a_dimension_rounded_to_a_multiple_is_evaluated_only_in_the_traced_sizes_class() -> None:
    # A kernel's padding to 32: ceil(n / 32) * 32, a line on each class of sizes modulo 32 and not across them.
    padded: list[Law] = [lambda n: 4096, lambda n: -(-n // 32) * 32 * 2]
    found = laws_of(padded, (512, 2048, 4096))  # differences 1536 and 3584: gcd 512
    assert found.modulus == 512
    assert found.covers(1024) and bytes_at(found, 1024) == [4096, 2048]
    assert not found.covers(1000)  # ceil(1000 / 32) * 32 = 1024: the line would say 1000
    assert bytes_at(found, 1000) is None


def test_bytes_that_would_be_a_fraction_are_not_evaluated() -> None:
    halves: list[Law] = [lambda n: 4096, lambda n: n // 2 * 8]  # 8, 16, 24 at 2, 4, 6: the line says 12 at 3
    found = laws_of(halves, (2, 4, 6))
    assert found.modulus == 2 and not found.covers(3)
    found = laws_of(halves, (2, 5, 6))  # 8, 16, 24: not on one line
    assert not found.covers(3)


def test_a_size_whose_events_differ_starts_a_group_of_its_own() -> None:
    found = SizeLaws(cuda=False)
    found.add(1, step(LINEAR, 1, extra=True))  # batch 1 takes another path
    for size in (2, 3, 8):
        found.add(size, step(LINEAR, size))
    assert found.differs is not None and "between 1 and 2" in found.differs
    assert found.covers(5) and bytes_at(found, 5) == [law(5) for law in LINEAR]
    assert found.broken is None


def test_events_that_change_back_and_forth_with_the_size_evaluate_nothing() -> None:
    found = SizeLaws(cuda=False)
    for size in (2, 5, 8):
        found.add(size, step(LINEAR, size))
    found.add(6, step(LINEAR, 6, extra=True))  # between two sizes whose events agree: a branch on the size's parity?
    assert found.broken is not None and not found.covers(3)
    assert next_sample((2, 3, 4, 5, 6, 7, 8), (2, 5, 6, 8), found) is None


def test_a_sweep_traces_its_ends_and_a_middle_that_keeps_the_residue_class_widest() -> None:
    assert sample_sizes((1, 2, 4)) == (1, 2, 4)
    assert sample_sizes((1, 2, 3, 4, 5, 6, 7, 8)) == (1, 8, 4)
    assert sample_sizes((512, 1024, 1536, 2048, 2560, 3072, 3584, 4096))[:2] == (512, 4096)
    # 16 and 64 are 48 apart, whose gcd with the span 112 is 16; 80 is 64 apart, gcd 16 too, and 32 apart gives 16:
    # each middle keeps the class at the sweep's own step, the nearest the middle first.
    assert sample_sizes((16, 32, 48, 64, 80, 96, 112, 128)) == (16, 128, 64)


def test_the_next_size_traced_is_the_one_that_lets_most_others_be_evaluated() -> None:
    found = SizeLaws(cuda=False)
    found.add(1, step(LINEAR, 1, extra=True))
    for size in (4, 8):
        found.add(size, step(LINEAR, size))
    # 3 joins 4 and 8 (and lets 5, 6, 7 be evaluated); 2 would be alone beside 1.
    assert next_sample((1, 2, 3, 4, 5, 6, 7, 8), (1, 4, 8), found) == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(0, 4096), st.integers(0, 1 << 20)), min_size=1,
                max_size=6),
       st.integers(1, 50), st.integers(1, 20), st.booleans())
def test_any_polynomial_of_degree_two_is_evaluated_exactly(coefficients: list[tuple[int, int, int]], start: int,
                                                          step_size: int, curved: bool) -> None:
    laws: list[Law] = [lambda n: 4096] + [
        (lambda n, a=a, b=b, c=c: (a * n * n if curved else 0) + b * n + c) for a, b, c in coefficients]
    traced = tuple(start + k * step_size for k in (0, 3, 5, 8))
    found = laws_of(laws, traced)
    for size in range(traced[0], traced[-1] + 1, step_size):
        assert found.covers(size)
        assert bytes_at(found, size) == [law(size) for law in laws]
