"""The plan search against a brute force that runs every plan of a space for real (tests/activations/brute_force.py).

Two claims, each on four small models (two Sequentials, a ModuleList transformer, an encoder-decoder):
- the lowest plan the search finds, applied to a real CPU step, peaks within 2% of the lowest peak of
  every plan the brute force runs, by the allocator's events; and an unreachable budget's message never
  names a figure more than 2% above that;
- every budget between the search's lowest and the step's peak without a plan gets a plan, and the plan
  holds when applied: the real step's peak fits the budget.
The spaces here are small enough for CI (12 to 32 real steps a model, 96 in all); test_segments_slow.py runs
larger ones (hundreds) under the `slow` marker. Each stack has three blocks or more: in a stack of two, the
peak is the first block's backward, which no plan lowers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import memlayout.activations as act
from tests.activations import brute_force, segment_models
from tests.activations.brute_force import Space

Case = tuple[Callable[[], torch.nn.Module], Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], Space]


def _top_level(path: str) -> bool:
    return "." not in path


def _blocks(path: str) -> bool:
    return path.count(".") == 1 and path.split(".")[0] in ("blocks", "encoder", "decoder")


CASES: dict[str, Case] = {
    # children: conv/ReLU x 3, head: every set of runs of the six conv and ReLU children (32 plans)
    "sequential-cnn": (lambda: segment_models.sequential_cnn((16, 16, 16), norm=False),
                       lambda: segment_models.inputs((8, 3, 32, 32)), Space(("",), _top_level, 0, within=6)),
    # Linear/Tanh x 3: every set of runs (32 plans)
    "sequential-mlp": (segment_models.sequential_mlp, lambda: segment_models.inputs((1024, 64)),
                       Space(("",), _top_level, 0)),
    # four blocks: every set of runs of blocks, with one of the other blocks alone (20 plans)
    "list-transformer": (segment_models.list_transformer, lambda: segment_models.inputs((4, 64, 64)),
                         Space(("blocks",), _blocks, 1)),
    # two encoder blocks and two decoder layers: every set of runs of each, with one other block alone (12 plans)
    "encoder-decoder": (segment_models.encoder_decoder, lambda: segment_models.inputs((4, 48, 64), (4, 32, 64)),
                        Space(("encoder", "decoder"), _blocks, 1)),
}


def _lowest_found(build: Callable[[], torch.nn.Module], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with pytest.raises(act.BudgetUnreachableError) as caught:
        act.analyze(build(), list(args), kwargs=kwargs, budget=1)
    lowest = caught.value.lowest
    line = caught.value.one_line()
    assert lowest.checks > 0 and not lowest.plan.empty, line
    assert f"of {lowest.checks} plan" in line and f"traced, over {lowest.searched}" in line, line
    assert "segment plans" in lowest.searched and "reachable" not in line
    return lowest


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_lowest_plan_found_is_within_2_percent_of_the_brute_forces_lowest(case: str) -> None:
    build, make_inputs, space = CASES[case]
    args, kwargs = make_inputs()
    best_plan, best, count = brute_force.lowest(build, args, kwargs, space)
    lowest = _lowest_found(build, args, kwargs)
    real = brute_force.real_peak(build, args, kwargs, lowest.plan)
    assert real <= 1.02 * best, (real, best, lowest.plan, best_plan, count)
    # The message's figure: never more than 2% above a plan the brute force ran.
    assert lowest.judged_bytes <= 1.02 * best, (lowest.judged_bytes, best, best_plan)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_budget_from_the_lowest_found_to_the_peak_gets_a_plan_that_holds(case: str) -> None:
    build, make_inputs, _ = CASES[case]
    args, kwargs = make_inputs()
    peak = act.analyze(build(), list(args), kwargs=kwargs).summary.peak_bytes
    lowest = _lowest_found(build, args, kwargs).judged_bytes
    assert lowest < peak
    for share in (0.0, 0.5):
        budget = lowest + int(share * (peak - lowest))
        report = act.analyze(build(), list(args), kwargs=kwargs, budget=budget)
        assert report.plan is not None and report.plan.peak_bytes <= budget
        real = brute_force.real_peak(build, args, kwargs, report.plan.plan, one_thread=False)
        assert real <= budget, (share, real, budget, report.plan.plan)
