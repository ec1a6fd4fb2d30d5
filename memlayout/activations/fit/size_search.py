"""What fits: the largest batch, or the longest sequence, whose step's peak fits a budget.

The model is built once; each probe re-makes the `--input` specs at one size and
traces the step again on fake (or meta) tensors, so a probe costs one trace and no
memory. The search grows the size from the one given (doubling) until a probe
does not fit, then bisects between the last size that fitted and the first that
did not. The peak is assumed to grow with the size; the answer's size and the size
after it are both traced, so the report shows the step between them.

Which dimension is scaled, from the input specs alone:
- batch: dim 0 of every input with at least one dimension;
- seq: dim 1 of every integer input with at least two dimensions (token ids,
  labels, an integer attention mask); `seq_dim=N` names another dimension, and then
  dim N of every input with more than N dimensions is scaled, whatever its dtype.
The scaled dimensions must all have the same size as given: they are one batch (or
one sequence) seen by several inputs.

The answer is given twice: with no checkpointing, and with a plan. A size fits
with a plan exactly when the `--budget` search (`analyze(..., budget=...)`, search.py)
finds one there: each planned probe runs that search, so `--fit`'s answer s and
`--budget` at s and s + 1 cannot disagree. Which sizes it probes is aimed first by
the planner's lowest plan, traced once far above the plain answer (`FLOOR_REACH`):
the line from the model's state through it is where the planned step's floor
crosses the budget. With ranks (`sharding`), each probe
predicts the ranks (`analyze_ranks`) and the peak is the largest rank's; the inputs
are one rank's batch.

What is compared with the budget is budget.py's figure: on CUDA the allocator's
reserved peak plus the CUDA runtime, against the budget or, without one, the whole
card as torch reports it; on the CPU the peak of live tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.activations.analysis import ActivationReport, predict_step
from memlayout.activations.fit.bracket import MAX_SIZE, largest_fitting
from memlayout.activations.fit.probes import (
    DeviceProbe,
    FitProbe,
    Probe,
    RanksProbe,
    ScaledDim,
    TracedFloor,
    specs_at,
)
from memlayout.activations.fit.sized_step import SizedStep
from memlayout.activations.model.input_specs import INTEGRAL, InputSpec, parse_input_spec
from memlayout.activations.ranks import predict_ranks
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.request.alternatives import hint as alternatives_hint
from memlayout.activations.request.alternatives import predicted
from memlayout.activations.request.python_call import call_request
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import FIT_RULE, Pipeline
from memlayout.activations.search import PlanResult
from memlayout.errors import Alternative, NothingFitsError, SettingError
from memlayout.format_bytes import human_bytes

if TYPE_CHECKING:
    from memlayout.activations.ranks.facts import RanksPlan

FLOOR_REACH = 16
"""Where `--fit` traces the lowest plan first: this many times the size after the plain answer, far enough that
the activations, which a plan's floor grows with, outweigh what does not grow (the optimizer's step)."""


@dataclass(frozen=True)
class FitAnswer:
    """The largest size that fits, and what the size after it did."""

    size: int
    """0 when not even a size of 1 fits."""
    peak_bytes: int | None
    """The peak at `size` (with a plan: traced with it applied); None when size is 0."""
    next_peak_bytes: int | None
    """The peak at size + 1 (with a plan: the lowest the search reached); None when it was not traced or failed."""
    next_failure: str | None = None
    """Why size + 1 is not the answer when that is not memory: the step failed there, or the search's limit."""
    plan: PlanResult | RanksPlan | None = None
    """The budget search's plan at `size`; None for the answer without checkpointing."""
    compared_bytes: int | None = None
    """The figure compared with the budget at `size` (budget.py); None where it is the peak."""
    next_compared_bytes: int | None = None
    """The same at size + 1."""
    next_checks: int = 0
    """With a plan: the plans the budget search traced at size + 1 before calling it unreachable."""
    next_cut_short: str | None = None
    """With a plan: where that search stopped at a limit of its own, and what it tried."""


@dataclass(frozen=True)
class FitReport:
    """What `memlayout activations --fit` reports."""

    axis: str
    """batch or seq."""
    dims: tuple[ScaledDim, ...]
    given_size: int
    budget_bytes: int
    budget_from: str
    """Where the budget came from, in words: "--budget 78.0 GiB", or the target GPU's memory."""
    without_plan: FitAnswer
    with_plan: FitAnswer | None
    """None for a forward-only step, which has no backward to checkpoint."""
    probes: tuple[FitProbe, ...]
    limit: str | None
    """A bound on the search other than memory (the model's positions, MAX_SIZE); None if none applied."""
    report: ActivationReport | RanksReport
    """The plain step (no plan) at the answer without checkpointing, or at size 1 when nothing fits without it."""
    compared: str = "the peak of live tensor bytes"
    """The figure of each size compared with the budget, in words (budget.py)."""
    floor: TracedFloor | None = None
    """The lowest plan traced far above the plain answer to aim the planned search; None where none was."""

    @property
    def world_size(self) -> int | None:
        return self.report.sharding.world_size if isinstance(self.report, RanksReport) else None


def scaled_dims(specs: Sequence[InputSpec], axis: str, seq_dim: int | None = None) -> tuple[tuple[ScaledDim, ...], int]:
    """The dimensions the search scales, and their size as given (the rule: see the module's docstring).

    Raises:
        UsageError: no input has such a dimension, or the inputs disagree on its size.
    """
    if axis == "batch":
        chosen = [(spec, 0) for spec in specs if len(spec.shape) >= 1]
    elif seq_dim is None:
        chosen = [(spec, 1) for spec in specs if spec.dtype in INTEGRAL and len(spec.shape) >= 2]
    else:
        chosen = [(spec, seq_dim) for spec in specs if len(spec.shape) > seq_dim]
    what = f"seq:{seq_dim}" if axis == "seq" and seq_dim is not None else axis
    if not chosen:
        raise SettingError(f"`fit` {what}: no `input` has the dimension it scales", FIT_RULE)
    sizes = {spec.shape[dim] for spec, dim in chosen}
    if len(sizes) > 1:
        shown = ", ".join(f"{spec.describe()} dim {dim}" for spec, dim in chosen)
        raise SettingError(f"`fit` {what}: the inputs disagree on its size ({shown})",
                         "give every input the same batch (or sequence) size")
    return tuple(ScaledDim(spec.describe(), dim) for spec, dim in chosen), sizes.pop()


def fit(target: Any, inputs: Sequence[str | InputSpec], *, with_plan: bool = True, **settings: Any) -> FitReport:
    """The largest batch (or longest sequence) whose step's peak fits `budget`, with and without a plan.

    Args:
        target: An nn.Module or a TARGET string, as for `analyze`.
        inputs: `input` specs (strings or `InputSpec`s) at any size; the scaled dimension is
            read off them (see the module's docstring) and the size given is where the search starts.
        with_plan: Also search the largest size the budget search's plan fits.
        settings: Any setting of `StepRequest` by name: `fit` (batch, seq or seq:N; or `axis` batch or seq and
            `seq_dim`, the dimension to scale in every input that has it), `budget` (what each size must fit in:
            bytes, each rank's peak with `world_size`, or a share of the target GPU's memory; None: the target
            GPU's whole memory; on CUDA the reserved peak plus the CUDA runtime is compared with it: budget.py),
            `gpu` (the step is traced for it, and its memory is the budget when none is given), `device`, `step`
            (train; inference, which has no plan to search; or generate with `new_tokens`: seq is then the
            longest prompt, batch the most sequences, that generate fits), `optimizer`, `autocast`, `dtype`,
            `world_size` and the ranks' settings (or `sharding`; the peak is the largest rank's), `trust`,
            `main_module`, `model_class`, and the adapters', as for `analyze`.

    Returns:
        A `FitReport`.

    Raises:
        NothingFitsError: not even a size of 1 fits.
        UsageError: no input has the dimension, the budget is below the weights, or bad arguments.
    """
    settings.setdefault("fit", None if "axis" in settings or "seq_dim" in settings else "batch")
    if settings["fit"] is None:
        del settings["fit"]
        settings.setdefault("axis", "batch")
    return predict_fit(call_request(target, inputs, None, Pipeline.FIT, settings), with_plan=with_plan)


def predict_fit(request: StepRequest, *, with_plan: bool = True, sized: SizedStep | None = None) -> FitReport:
    """The request's `fit`: the largest size whose step fits its `budget` (see `fit`); `sized`, a sweep's step
    already built at the same specs, is searched instead of building the model again."""
    axis, seq_dim = request.fit_axis
    specs = [parse_input_spec(s) if isinstance(s, str) else s for s in request.input]
    if not specs or not all(isinstance(s, InputSpec) for s in specs):
        raise SettingError("`fit` scales the inputs' sizes, so it needs them as `input` specs",
                           "give each input as `input` DTYPE[SHAPE], e.g. `input='int64[1,4096]<32000'`")
    dims, given = scaled_dims(specs, axis, seq_dim)
    probe: Probe = RanksProbe(request, specs, dims) if request.world_size is not None \
        else DeviceProbe(request, specs, dims, sized)
    search = SizeSearch(probe, axis, _search_cap(probe, axis))
    search.check_state(given)
    size = search.plain_answer(given)
    without = search.answer(size, search.plain.get(size), search.plain.get(size + 1))
    # Taken now: the planned search traces other sizes, and a probe keeps only its latest traces.
    report = probe.report_at(max(size, 1))
    with_answer = search.planned_answer(size) if with_plan and request.step == "train" else None
    if without.size == 0 and (with_answer is None or with_answer.size == 0):
        raise _nothing_fits(search)
    return FitReport(
        axis=axis, dims=dims, given_size=given, budget_bytes=probe.budget.bytes, budget_from=probe.budget.said,
        compared=probe.budget.describe_figure(), without_plan=without, with_plan=with_answer,
        probes=tuple(search.probes), limit=search.limit if without.size == search.cap else None, report=report,
        floor=search.floor,
    )


def _nothing_fits(search: SizeSearch) -> NothingFitsError:
    """Not even a size of 1 fits: the error, with what the request did not try, each traced once at size 1."""
    lowest = [p.judged_bytes for p in search.probes if p.size == 1 and p.judged_bytes is not None]
    alternatives, hint = untried_at_one(search.probe, search.axis)
    return NothingFitsError(search.axis, search.probe.budget.bytes, min(lowest) if lowest else None, hint,
                            alternatives)


def untried_at_one(probe: Probe, axis: str) -> tuple[tuple[Alternative, ...], str]:
    """What the probe's request did not try, each traced once at size 1 (request/alternatives.py), and the hint
    that names them."""
    at_one = tuple(specs_at(probe.specs, probe.dims, 1))

    def measure(changed: StepRequest) -> int:
        # The plain step at size 1 with the setting applied, judged as each probe of the search is.
        one = dataclasses.replace(changed, input=at_one, fit=None, budget=None, pipeline=None, real=False)
        if one.world_size is not None:
            return int(predict_ranks(one).largest.judged_bytes)
        return probe.budget.judged(predict_step(one).summary)

    alternatives = predicted(probe.request, measure)
    return alternatives, alternatives_hint(alternatives, f"at {axis} 1", ["raise `budget`"])


def _search_cap(probe: Probe, axis: str) -> tuple[int, str | None]:
    """The largest size the search may reach, and why it stops there (None: MAX_SIZE, no bound of the model's)."""
    if axis == "seq":
        positions = probe.position_limit()
        if positions is not None:
            return positions[1], f"the model's {positions[0]} ({positions[1]})"
    return MAX_SIZE, None


class SizeSearch:
    """`--fit`'s two searches over one probe: the plain step's sizes, then, above its answer, the budget search's.

    Each size is probed once per kind (`plain`, `planned`), and every probe is kept in the order it ran
    (`probes`), for the report.
    """

    def __init__(self, probe: Probe, axis: str, cap: tuple[int, str | None]) -> None:
        self.probe, self.axis = probe, axis
        self.cap, self.limit = cap
        self.plain: dict[int, FitProbe] = {}
        self.planned: dict[int, FitProbe] = {}
        self.probes: list[FitProbe] = []
        self.floor: TracedFloor | None = None
        """The lowest plan traced far above the plain answer to aim the planned search; None where none was."""
        self.state_bytes = 0
        """The model's own state at size 0, and on CUDA the runtime beside it: the lines' anchor."""

    def probe_plain(self, size: int) -> FitProbe:
        if size not in self.plain:
            self.plain[size] = self.probe.plain(size)
            self.probes.append(self.plain[size])
        return self.plain[size]

    def probe_planned(self, size: int) -> FitProbe:
        if size not in self.planned:
            self.planned[size] = self.probe.planned(size)
            self.probes.append(self.planned[size])
        return self.planned[size]

    def check_state(self, given: int) -> None:
        """Probe the size given (a failure there is the inputs' fault: it propagates), and refuse a budget below
        the model's own state, at which no size fits, naming what the request did not try, each with its figure."""
        self.probe_plain(given)
        budget = self.probe.budget
        self.state_bytes = self.probe.state_bytes() + (budget.runtime_bytes or 0)
        if self.state_bytes >= budget.bytes:
            runtime = " and the CUDA runtime beside it" if budget.runtime_bytes else ""
            raise SettingError(
                f"the budget {human_bytes(budget.bytes)} ({budget.bytes} bytes) is below the model's own "
                f"state{runtime}, {human_bytes(self.state_bytes)} ({self.state_bytes} bytes: parameters, buffers"
                f"{', optimizer state' if self.probe.optimizer != 'none' else ''}): no {self.axis} fits",
                untried_at_one(self.probe, self.axis)[1],
            )

    def plain_answer(self, given: int) -> int:
        """The largest size whose plain step fits (0: not even 1)."""
        return largest_fitting(self.probe_plain, given, anchor=(0, self.state_bytes), budget=self.probe.budget.bytes,
                               cap=self.cap)

    def planned_answer(self, plain: int) -> FitAnswer:
        """The largest size the budget search finds a plan for, searched above the plain answer `plain` only:
        every size up to it fits with the empty plan, which is what the budget search returns there.

        A plan leaves the model's state as it is, so the state at size 0 anchors the line with the plan as it
        does without. The lowest plan's figure grows nearly in a line from the state at 0 once the activations
        outweigh the optimizer's step (Llama-7B at 4,096 tokens on an H100: 72.0 GB at batch 2 and 6, the
        optimizer's peak; 88.0 GB at 13 and 174.6 GB at 37, within 0.1 GB of the line). Traced once far above the
        plain answer, it aims the first budget search near the answer, rather than a search at every size on the
        way. Where nothing fits without a plan, a size of 1 decides whether anything does with one before a floor
        is worth tracing (a 1.1B Llama at 2,048 tokens in 16 GiB of CPU: the floor at 16 aimed the search at 3,
        15 traces and 34.0 s for an answer of 0 that batch 1 gives in 4 traces and 11.8 s).
        """
        known = 1 if plain == 0 and self.probe_planned(1).fits else plain
        far = min(self.cap, FLOOR_REACH * (known + 1))
        self.floor = self.probe.floor(far) if known and far > known + 1 else None
        best = 0 if not known else largest_fitting(
            self.probe_planned, known + 1, known_fit=known, anchor=(0, self.state_bytes),
            floor=None if self.floor is None else (self.floor.size, self.floor.compared_bytes),
            budget=self.probe.budget.bytes, cap=self.cap)
        plan = self.probe.plan_at(best) if best else None
        at = self.planned.get(best) or self.plain.get(best)
        answer = dataclasses.replace(self.answer(best, at, self.planned.get(best + 1)), plan=plan)
        if isinstance(plan, PlanResult) and best in self.planned:  # the probe's plan, pruned: its own peak
            answer = dataclasses.replace(answer, peak_bytes=plan.peak_bytes, compared_bytes=plan.compared_bytes)
        return answer

    def answer(self, size: int, at: FitProbe | None, after: FitProbe | None) -> FitAnswer:
        """The answer `size`, with what its probe and the probe of the size after it found."""
        failure = after.failure if after is not None else None
        if after is None and size >= self.cap:
            failure = (f"the search stops at {self.cap}: {self.limit}" if self.limit
                       else f"the search stops at {self.cap}")
        return FitAnswer(
            size=size,
            peak_bytes=at.peak_bytes if at is not None and size else None,
            next_peak_bytes=after.peak_bytes if after is not None else None,
            next_failure=failure,
            compared_bytes=at.compared_bytes if at is not None and size else None,
            next_compared_bytes=after.compared_bytes if after is not None else None,
            next_checks=after.checks if after is not None else 0,
            next_cut_short=after.cut_short if after is not None else None,
        )
