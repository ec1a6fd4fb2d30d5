"""The budget search's parts: the trace memo, the exclusion set, the search itself; and `--fit` agreeing with it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from memlayout.activations.budget import Budget
from memlayout.activations.fit.probes import DeviceProbe
from memlayout.activations.fit.size_search import SizeSearch, scaled_dims
from memlayout.activations.model.input_specs import parse_input_spec
from memlayout.activations.plans.plan import Plan, SequentialSegments
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.search import (
    RESTART,
    Exclusions,
    TraceFailure,
    TraceMemo,
    plan_for_budget,
    search_plan,
)
from memlayout.activations.summary import module_facts
from memlayout.errors import BudgetUnreachableError

SPECS = ("int64[2,32]<500", "labels=int64[2,32]<500")


class CountingStep:
    """A step whose traces are counted; a plan naming `fails` raises, as a checkpointed module that cannot rerun."""

    device = "cpu"

    def __init__(self, fails: str = "") -> None:
        self.fails = fails
        self.traced: list[Plan] = []

    def trace(self, plan: Plan) -> Any:
        self.traced.append(plan)
        if self.fails and self.fails in plan.checkpoint:
            raise RuntimeError(f"{self.fails} cannot rerun")
        return SimpleNamespace(rerun_state_differs=(("block", "self.state was 1 and then 2"),)
                               if "block" in plan.checkpoint else ())


def test_the_memo_traces_each_plan_once_and_keeps_what_failed_without_its_frames() -> None:
    step = CountingStep(fails="bad")
    memo = TraceMemo(step)  # type: ignore[arg-type]
    failed = memo.trace(Plan(checkpoint=("bad",)))
    assert isinstance(failed, TraceFailure) and failed.error is not None and failed.error.__traceback__ is None
    assert memo.trace(Plan(checkpoint=("bad",))) is failed
    unfaithful = memo.trace(Plan(checkpoint=("block",)))
    assert isinstance(unfaithful, TraceFailure) and unfaithful.error is None and unfaithful.differs
    assert step.traced == [Plan(checkpoint=("bad",)), Plan(checkpoint=("block",))]
    assert memo.summaries() == {}


def test_a_failing_plan_excludes_the_modules_that_fail_alone() -> None:
    exclusions = Exclusions({})
    alone = {"a": "ok", "b": "fails"}

    def retrace(plan: Plan) -> Any:
        (path,) = plan.checkpoint
        if alone[path] == "fails":
            exclusions.why[path] = "fails alone"
            return RESTART
        return SimpleNamespace()

    exclusions.blame(Plan(checkpoint=("a", "b")), RuntimeError("x"), retrace)
    assert exclusions.why == {"b": "fails alone"}


def test_a_plan_whose_modules_fail_only_together_excludes_them_all() -> None:
    exclusions = Exclusions({})
    exclusions.blame(Plan(checkpoint=("a",), sequential=(SequentialSegments("s", 2),)), RuntimeError("boom"),
                     lambda plan: SimpleNamespace())
    assert exclusions.why == {path: "checkpointed together with a, s: checkpointed, the step raised RuntimeError: "
                                    "boom" for path in ("a", "s")}


def test_a_rerun_that_is_no_replay_excludes_the_module_around_it() -> None:
    exclusions = Exclusions({})
    exclusions.unfaithful(Plan(checkpoint=("block", "other")), (("block.inner", "self.n was 1 and 2 when ..."),))
    assert list(exclusions.why) == ["block"] and "in block.inner" in exclusions.why["block"]


def test_the_search_starts_again_when_a_traced_plan_failed() -> None:
    class Planner:
        options: tuple[Any, ...] = ()

        def search(self, target: int) -> list[int]:
            return [0]

        def plan_of(self, chosen: list[int]) -> Plan:
            return Plan(checkpoint=("m",))

        def estimate(self, chosen: list[int]) -> int:
            return 0

    found = search_plan(Planner(), Budget(100, "test"), lambda plan: RESTART, {})  # type: ignore[arg-type]
    assert found is RESTART


@pytest.fixture(scope="module")
def gpt2_probe() -> DeviceProbe:
    request = StepRequest("tests.activations.models:gpt2", input=SPECS, fit="batch", budget="3MiB")
    specs = [parse_input_spec(spec) for spec in SPECS]
    dims, _ = scaled_dims(specs, "batch")
    return DeviceProbe(request, specs, dims)


def test_fit_and_budget_agree_over_the_search_objects(gpt2_probe: DeviceProbe) -> None:
    """`--fit`'s planned answer s is where the budget search, run afresh as `--budget` runs it, finds a plan, and
    s + 1 where it finds none."""
    search = SizeSearch(gpt2_probe, "batch", (1 << 24, None))
    search.check_state(2)
    plain = search.plain_answer(2)
    answer = search.planned_answer(plain)
    assert answer.size > plain >= 1

    def budget_search(size: int) -> Any:
        trace, summary = gpt2_probe._trace(size)
        return plan_for_budget(gpt2_probe.step, trace, summary, module_facts(trace), gpt2_probe.budget)

    found = budget_search(answer.size)
    assert not found.plan.empty and found.judged_bytes <= gpt2_probe.budget.bytes
    assert answer.plan is not None and answer.plan.plan == found.plan  # the plan --fit reports is --budget's
    with pytest.raises(BudgetUnreachableError):
        budget_search(answer.size + 1)
