"""Segment plans: runs of a container's children checkpointed as one, offered by the planner, traced like any plan,
and applied by apply_plan (plans/segments.py, plans/apply_segments.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

import memlayout.activations as act
from memlayout.activations.analysis import prepare_step
from memlayout.activations.plans.plan import Plan, Planner, Segment, SequentialSegments
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.summary import summarize
from memlayout.errors import SegmentBroken, UsageError
from tests.activations import segment_models
from tests.activations.measure import allocator_peak_step

ISSUE_BUDGET = 116_180_842
"""110.8 MiB: the budget the issue's CNN was called unreachable at (its lowest reachable peak 116.3 MiB, said the
message), where checkpoint_sequential in 3 segments measures 105.1 MB for real on this machine's allocator."""


def _same_step(planned: Any, plain: Any) -> bool:
    return torch.equal(planned.loss, plain.loss) and planned.grads.keys() == plain.grads.keys() and all(
        torch.equal(planned.grads[name], grad) for name, grad in plain.grads.items())


def _nested(a: str, b: str) -> bool:
    return a == b or a == "" or b == "" or a.startswith(b + ".") or b.startswith(a + ".")


def test_options_conflict_exactly_when_they_checkpoint_a_module_twice() -> None:
    """Options.conflicts_with against its definition: the subtrees each option checkpoints overlap."""
    args, _ = segment_models.inputs((2, 16, 64))
    planner = Planner(act.analyze(segment_models.list_transformer(), list(args)).trace)
    options = planner.options
    assert any(o.span is not None for o in options) and any(o.span is None for o in options)

    def regions(option: Any) -> tuple[str, ...]:
        return option.covers if option.span is not None else (option.path,)

    for a, b in itertools.combinations(options, 2):
        expected = any(_nested(x, y) for x in regions(a) for y in regions(b))
        assert a.conflicts_with(b) == expected == b.conflicts_with(a), (a.path, a.span, b.path, b.span)


def test_the_planner_offers_runs_of_a_called_sequential_and_of_an_iterated_module_list() -> None:
    args, _ = segment_models.inputs((4, 3, 16, 16))
    cnn = Planner(act.analyze(segment_models.sequential_cnn((8, 16)), list(args)).trace)
    assert {o.span for o in cnn.options if o.path == "" and o.span} >= {(0, 2), (3, 5), (0, 5)}
    assert cnn.containers[""].called
    args, _ = segment_models.inputs((2, 16, 64))
    transformer = Planner(act.analyze(segment_models.list_transformer(), list(args)).trace)
    assert {o.span for o in transformer.options if o.path == "blocks"} == {
        (0, 1), (1, 2), (2, 3), (0, 2), (1, 3), (0, 3)}
    assert not transformer.containers["blocks"].called
    assert Planner(transformer.trace, segments=False).options == [o for o in transformer.options if o.span is None]


class ScaledBetweenBlocks(nn.Module):
    """A loop that does something between its blocks: no run of them replays as one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) * 0.5
        return x


def test_no_run_is_offered_where_the_loop_does_something_between_blocks() -> None:
    args, _ = segment_models.inputs((64, 32))
    planner = Planner(act.analyze(ScaledBetweenBlocks(), list(args)).trace)
    assert not any(o.path == "blocks" for o in planner.options)
    assert planner.containers["blocks"].passes and planner.containers["blocks"].run(0, 1) is None


def test_a_plan_of_runs_becomes_checkpoint_sequential_where_the_split_is_equal() -> None:
    args, _ = segment_models.inputs((8, 3, 64, 64))
    planner = Planner(act.analyze(segment_models.issue_cnn(), list(args)).trace)
    splits = planner._splits_as_runs()
    assert splits
    for runs in splits:  # each checkpoint_sequential split, as its runs: the same plan
        plan = planner.plan_of(runs)
        assert plan.segments == () and [s.segments for s in plan.sequential] == [len(runs) + 1]
    rows = {o.span: row for row, o in enumerate(planner.options) if o.path == "" and o.span is not None}
    assert planner.plan_of([rows[(0, 10)], rows[(11, 13)]]) == Plan(segments=(Segment("", 0, 10), Segment("", 11, 13)))


@pytest.mark.parametrize("case", ["sequential", "module-list"])
def test_segments_applied_lower_the_real_peak_and_change_no_bit(case: str) -> None:
    if case == "sequential":
        build, (args, _) = (lambda: segment_models.sequential_cnn((8, 16))), segment_models.inputs((8, 3, 32, 32))
        plan = Plan(segments=(Segment("", 0, 3), Segment("", 4, 5)))
    else:
        build, (args, _) = segment_models.list_transformer, segment_models.inputs((8, 64, 64))
        plan = Plan(segments=(Segment("blocks", 0, 2),))
    plain = allocator_peak_step(build(), args, {})
    model = build()
    forwards = {name: "forward" in vars(m) for name, m in model.named_modules()}
    with act.apply_plan(model, plan):
        planned = allocator_peak_step(model, args, {})
    assert planned.peak_bytes < plain.peak_bytes
    assert _same_step(planned, plain)
    # taken off: no forward left behind, no hook left on any block
    assert {name: "forward" in vars(m) for name, m in model.named_modules()} == forwards
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


class FeedsAnotherTensor(nn.Module):
    """Iterates its blocks as a chain when traced; `detour` feeds the third block a copy instead."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(3))
        self.detour = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            x = block(x.clone() if self.detour and index == 2 else x)
        return x


def test_a_loop_that_no_longer_chains_its_blocks_fails_the_step_and_leaves_no_region_open() -> None:
    model = FeedsAnotherTensor()
    args = (torch.randn(16, 32),)
    with act.apply_plan(model, Plan(segments=(Segment("blocks", 1, 2),))):
        model(*args).sum().backward()  # chained: the region opens and closes
        model.detour = True
        with pytest.raises(SegmentBroken, match="not fed the output of the one before"):
            model(*args)
    # the region was closed: a step after it is a plain one, its gradients a fresh model's
    model.detour = False
    model.zero_grad(set_to_none=True)
    fresh = FeedsAnotherTensor()
    model(*args).sum().backward()
    fresh(*args).sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), fresh.parameters(), strict=True))


class DetoursAtTheFourthBlock(nn.Module):
    """Six blocks; the fourth is fed a copy of the third's output, so no segment may run from block 2 into 3."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            x = block(x.clone() if index == 3 else x)
        return x.square().mean()


def test_segment_brokens_hint_followed_a_plan_made_again_from_this_models_step_runs_and_fits() -> None:
    args = (torch.randn(2048, 64),)
    model = DetoursAtTheFourthBlock()
    with act.apply_plan(model, Plan(segments=(Segment("blocks", 1, 3),))), pytest.raises(SegmentBroken) as broken:
        model(*args)
    assert "make the plan again from this model's step" in broken.value.hint
    budget = int(act.analyze(DetoursAtTheFourthBlock(), list(args)).summary.peak_bytes * 0.6)
    report = act.analyze(DetoursAtTheFourthBlock(), list(args), budget=budget)
    assert report.plan is not None and report.plan.plan.segments
    model = DetoursAtTheFourthBlock()
    with act.apply_plan(model, report.plan.plan):
        real = allocator_peak_step(model, args, {})
    assert real.peak_bytes <= budget, (real.peak_bytes, report.plan.plan)


@pytest.mark.parametrize("plan, message", [
    ({"segments": [{"module": "blocks", "first": 2, "last": 4}]}, "do not fit"),
    ({"segments": [{"module": "blocks", "first": 0, "last": 1}, {"module": "blocks", "first": 1, "last": 2}]},
     "overlap"),
    ({"segments": [{"module": "blocks", "first": 0}]}, "malformed"),
    ({"segments": [{"module": "nope", "first": 0, "last": 1}]}, "not a module"),
])
def test_apply_plan_refuses_segments_the_model_does_not_have(plan: dict[str, Any], message: str) -> None:
    model = FeedsAnotherTensor()
    with pytest.raises(UsageError, match=message):
        act.apply_plan(model, plan)
    assert all(not m._forward_pre_hooks and "forward" not in vars(m) for m in model.modules())


def test_a_plan_with_segments_round_trips_through_json() -> None:
    plan = Plan(checkpoint=("head",), sequential=(SequentialSegments("features", 2),),
                segments=(Segment("blocks", 0, 2), Segment("blocks", 4, 5)))
    assert Plan.coerce(plan.to_dict()) == plan
    assert Plan.coerce({"checkpoint": ["a"], "sequential": []}).segments == ()  # a report from before segments


def test_the_issues_cnn_gets_a_plan_at_its_budget_that_holds_for_real() -> None:
    """The issue's CNN at 110.8 MiB: called unreachable (lowest reachable 116.3 MiB) by a search over modules and
    checkpoint_sequential's equal splits alone."""
    args, _ = segment_models.inputs((8, 3, 64, 64))
    report = act.analyze(segment_models.issue_cnn(), list(args), budget=ISSUE_BUDGET)
    assert report.plan is not None and not report.plan.plan.empty
    assert report.plan.peak_bytes <= ISSUE_BUDGET
    model = segment_models.issue_cnn()
    with act.apply_plan(model, report.plan.plan):
        real = allocator_peak_step(model, args, {})
    assert real.peak_bytes <= ISSUE_BUDGET, (real.peak_bytes, report.plan.plan)
    assert abs(real.peak_bytes - report.plan.peak_bytes) <= 0.02 * real.peak_bytes


def test_an_unreachable_budget_says_what_was_searched_and_its_hint_works() -> None:
    args, _ = segment_models.inputs((8, 3, 32, 32))
    with pytest.raises(act.BudgetUnreachableError) as caught:
        act.analyze(segment_models.sequential_cnn((8, 16)), list(args), budget=1000)
    line, lowest = caught.value.one_line(), caught.value.lowest
    assert "no checkpoint plan found fits a budget of 1000 B" in line
    # every child alone frees nothing here: the options are the segments
    assert lowest.searched == "segment plans" and f"of {lowest.checks} plans traced, over segment plans, is" in line
    assert f"({lowest.peak_bytes} bytes)" in line and "reachable" not in line
    assert "raise `budget` to at least the lowest figure" in line
    # the hint: that figure as the budget gets a plan
    again = act.analyze(segment_models.sequential_cnn((8, 16)), list(args), budget=lowest.peak_bytes)
    assert again.plan is not None and again.plan.peak_bytes <= lowest.peak_bytes


def test_the_lowest_plan_is_the_lowest_estimate_of_every_set_of_options_on_a_stack() -> None:
    """The beam over module and segment options against every set of options that do not conflict, by the
    planner's own estimate (the real steps' brute force is test_segments_brute_force.py)."""
    args, _ = segment_models.inputs((8, 3, 32, 32))
    planner = Planner(act.analyze(segment_models.sequential_cnn((8, 16)), list(args)).trace)
    options, rows = planner.options, planner._rows
    lowest = [int(planner._interval_max.max())]

    def walk(row: int, chosen: list[int], values: Any) -> None:
        if row == len(options):
            lowest[0] = min(lowest[0], int(values.max()))
            return
        walk(row + 1, chosen, values)
        if not any(options[row].conflicts_with(options[other]) for other in chosen):
            walk(row + 1, [*chosen, row], values + rows[row])

    walk(0, [], planner._interval_max.copy())
    assert planner.estimate(planner.lowest()) == lowest[0] < planner.baseline_peak


def test_a_traced_segment_plan_is_the_real_steps_peak_to_the_byte_on_each_thread_count() -> None:
    """The brute force's CNN in checkpoint_sequential's 2 segments, traced and run for real at 2 threads, then at 1,
    in one process: a convolution's backward takes scratch per thread, and the rules trace/kernel_storage.py learns
    are kept per thread count. Kept for any count, the trace on 1 thread was 2,837,128 B against the real
    2,807,176 B: the 2-thread scratch."""
    def build() -> nn.Module:
        return segment_models.sequential_cnn((16, 16, 16), norm=False)

    args, _ = segment_models.inputs((8, 3, 32, 32))
    plan = Plan(sequential=(SequentialSegments("", 2),))
    threads = torch.get_num_threads()
    figures = {}
    try:
        for count in (2, 1):
            torch.set_num_threads(count)
            step, *_ = prepare_step(StepRequest(build(), input=("float32[8,3,32,32]",), optimizer="adamw"))
            traced = summarize(step.trace(plan)).peak_bytes
            model = build()
            with act.apply_plan(model, plan):
                real = allocator_peak_step(model, args, {}).peak_bytes
            figures[count] = (traced, real)
    finally:
        torch.set_num_threads(threads)
    assert all(traced == real for traced, real in figures.values()), figures
    assert figures[2][1] != figures[1][1], figures  # the two thread counts do differ for real
