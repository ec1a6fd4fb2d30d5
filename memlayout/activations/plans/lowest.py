"""The lowest peak a planner's options reach: a beam search over moves, ranked by the highest intervals in turn.

A plan's estimated live curve is the baseline's interval maxima plus the rows of its
options (plan.py). A move adds one option and drops the chosen ones it conflicts with
(a module replacing the modules inside it). A move counts as lower when it lowers the
highest intervals taken in order (the peak, then the next highest, ...: `_leximax`),
not the peak alone: in a two-block GPT-2 the peak sits in the second block while the
first is planned, so a move in the first block leaves the peak where it was, and a
walk that asks each move to lower the peak stops at a whole block checkpointed
(3.59 MB estimated), where moves inside both blocks reach 3.20 MB, the lowest of all
the plans (tests/activations/plans/test_planner.py checks it against brute force). Each
round scores every move from each plan kept at once, and keeps `LOWEST_BEAM` plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

LOWEST_BEAM = 4
"""Plans kept at each round."""
LEXIMAX_DEPTH = 8
"""How many of the highest intervals `_leximax` compares."""
FLOAT_EXACT = 2**53
"""Integers below this are exact in a float64, and so are sums of them that stay below it."""


def conflict_matrix(options: Sequence[Any]) -> np.ndarray:
    """conflicts[a, b] when options a and b do not go together (plan.py's `Option.conflicts_with`)."""
    import numpy as np

    count = len(options)
    conflicts = np.zeros((count, count), dtype=bool)
    for a in range(count):
        for b in range(a, count):
            conflicts[a, b] = conflicts[b, a] = options[a].conflicts_with(options[b])
    return conflicts


def lowest_options(
    start: np.ndarray, rows: np.ndarray, costs: np.ndarray, conflicts: np.ndarray,
    seeds: Sequence[Sequence[int]] = (),
) -> tuple[list[int], int]:
    """The options (row indexes) of the lowest plan found, and its estimated peak.

    The beam starts from the empty plan and, apart, from `seeds` (plans to refine), and the lower
    of the two searches wins, so a seed can only lower what the empty start finds. From the
    empty plan, whole blocks are the first moves, and a move that swaps a block for a part of it
    raises the peak before it lowers it: HunYuan-MoE's two layers ended at 4,831,788 B
    estimated, each layer whole, while its attention, router, experts, shared MLP and norms
    each whole reach 3,171,756 B, the lowest of all its plans, found from the covers.

    Args:
        start: The baseline's value in each interval.
        rows: Each option's change to each interval.
        costs: Each option's cost, to break ties (the cheaper plan of two equally low ones).
        conflicts: conflicts[a, b] when options a and b do not go together.
        seeds: Plans (option rows that do not conflict) a second beam starts from.
    """
    best_rows, best_key = _beam(start, rows, costs, conflicts, [[]])
    if seeds and len(rows):
        seeded_rows, seeded_key = _beam(start, rows, costs, conflicts, [list(seed) for seed in seeds])
        if seeded_key < best_key:
            best_rows, best_key = seeded_rows, seeded_key
    return best_rows, best_key[0]


def _beam(
    start: np.ndarray, rows: np.ndarray, costs: np.ndarray, conflicts: np.ndarray, seeds: list[list[int]]
) -> tuple[list[int], tuple[int, ...]]:
    """The lowest plan a beam search from `seeds` reaches (one of them, if no move lowers it), and its key."""
    import numpy as np

    count = len(rows)
    beam: list[tuple[list[int], np.ndarray, tuple[int, ...]]] = []
    for seed in seeds:
        values = start + rows[seed].sum(axis=0) if seed else start.copy()
        beam.append((seed, values, _leximax(values)))
    beam.sort(key=lambda item: (item[2], float(costs[item[0]].sum()), sorted(item[0])))
    best_rows, _, best_key = beam[0]
    beam = beam[:LOWEST_BEAM]
    seen: set[frozenset[int]] = {frozenset(seed) for seed in seeds}
    if not count:
        return best_rows, best_key
    conflicting = conflicts.tolist()  # read one pair at a time below, where a list is faster than the array
    exact_in_floats = bool(np.abs(rows).sum() < FLOAT_EXACT)
    while beam:
        grown: list[tuple[tuple[int, ...], float, list[int], np.ndarray]] = []
        for chosen, values, key in beam:
            moved = values[None, :] + rows
            if chosen:
                moved -= _conflicting_sums(conflicts[:, chosen], rows[chosen], exact_in_floats)
            keys = _leximax_rows(moved).tolist()
            members = set(chosen)
            for row in range(count):
                if row in members:
                    continue
                apart = conflicting[row]
                taken = [other for other in chosen if not apart[other]] + [row]
                found = frozenset(taken)
                if found in seen:
                    continue
                seen.add(found)
                row_key = tuple(keys[row])
                if row_key < key:
                    grown.append((row_key, float(costs[taken].sum()), taken, moved[row]))
        grown.sort(key=lambda item: (item[0], item[1], sorted(item[2])))
        beam = [(taken, values, key) for key, _, taken, values in grown[:LOWEST_BEAM]]
        if grown and grown[0][0] < best_key:
            best_key, best_rows = grown[0][0], grown[0][2]
    return best_rows, best_key


def pruned(start: np.ndarray, rows: np.ndarray, costs: np.ndarray, chosen: Sequence[int]) -> list[int]:
    """`chosen` less each option, the costliest first, whose drop leaves the highest intervals (`_leximax`) no
    higher. Kept to the peak alone, a lowest plan lost what lowers the intervals just below it: in a stack of
    eight residual blocks, whose estimate puts the peak where no option reaches, one block was kept (75.1 MB
    for real) of the three the beam took (73.1 MB, what all eight reach)."""
    import numpy as np

    def key(taken: list[int]) -> tuple[int, ...]:
        return _leximax(start + rows[taken].sum(axis=0) if taken else np.array(start, copy=True))

    kept = list(chosen)
    best = key(kept)
    for row in sorted(chosen, key=lambda r: (-float(costs[r]), r)):
        trial = [r for r in kept if r != row]
        if key(trial) <= best:
            kept = trial
    return kept


def _conflicting_sums(conflicts: np.ndarray, rows: np.ndarray, exact_in_floats: bool) -> np.ndarray:
    """For each option, the sum of `rows` (the chosen options' rows) it conflicts with (`conflicts`: options x
    chosen). numpy multiplies integer matrices without BLAS (162 options by 130 chosen by 292
    intervals, Llama-7B's: 2.6 ms, against 0.26 ms in floats); in floats the sums are exact
    while every partial sum stays under FLOAT_EXACT, which `exact_in_floats` says of all the rows together."""
    import numpy as np

    if exact_in_floats:
        return np.rint(conflicts.astype(np.float64) @ rows.astype(np.float64)).astype(np.int64)
    sums: np.ndarray = conflicts.astype(np.int64) @ rows
    return sums


def _leximax(values: np.ndarray) -> tuple[int, ...]:
    """The highest interval values in descending order: a plan is lower than another when this is smaller."""
    return tuple(int(v) for v in _leximax_rows(values[None, :])[0])


def _leximax_rows(values: np.ndarray) -> np.ndarray:
    """`_leximax` of each row of a matrix, as a matrix."""
    import numpy as np

    width = values.shape[1]
    depth = min(LEXIMAX_DEPTH, width)
    top = np.partition(values, width - depth, axis=1)[:, width - depth:]
    return -np.sort(-top, axis=1)
