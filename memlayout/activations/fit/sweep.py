"""`--sweep`: the step at each size of its batch or sequence, traced at a few sizes and evaluated at the rest.

The model is built once (`SizedStep`). The sweep traces its smallest, largest and middle
sizes first; where the traces' events agree, each storage's bytes follow a law in the
size, checked at a traced size not used to fit it, and the sizes between are evaluated
from those laws through the allocator model, as a trace there would be
(size_laws.py). A size the laws do not cover is traced, and joins them. Where two
traced sizes' events differ, every size is traced, and the report says where they
differ. Each row is what one prediction at its size reports: the peak of live tensors,
on a GPU the allocator's peaks and the figure compared with the card, and whether it
fits the budget.

With `budget`, each size where the plain step does not fit is searched for a plan, as
`--budget` at that size searches (the plan's figures are the search's traces, never
evaluated: the search prices each module's rerun with the FLOPs and times of a trace).
With `fit` too, its answers, searched on the same built model (size_search.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from memlayout.activations.analysis import ActivationReport, target_gpu
from memlayout.activations.budget import Budget, card_budget, resolve_budget
from memlayout.activations.fit.size_laws import next_sample, sample_sizes
from memlayout.activations.fit.size_search import FitReport, predict_fit, scaled_dims
from memlayout.activations.fit.sized_step import ScaledDim, SizedStep
from memlayout.activations.model.input_specs import InputSpec, parse_input_spec
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.search import PlanResult, plan_for_budget
from memlayout.activations.summary import Summary, module_facts
from memlayout.errors import BudgetUnreachableError, SettingError, UsageError

TRACED = "traced"
EVALUATED = "evaluated"
FAILED = "failed"


@dataclass(frozen=True)
class SweepPlan:
    """The budget search at one size of a sweep, where the plain step does not fit."""

    found: bool
    """Whether a plan fits; else `result` is the lowest the search reached."""
    result: PlanResult | None
    """The plan found (pruned, as `--budget` gives it) or the lowest reached; None where the search failed."""
    failure: str | None = None
    """Why the search stopped, when that is not memory (the step failed with a plan)."""


@dataclass(frozen=True)
class SweepRow:
    """One size of a sweep: what one prediction at that size reports."""

    size: int
    source: str
    """traced (a trace at this size), evaluated (from the traces at other sizes: size_laws.py) or failed."""
    peak_bytes: int | None
    """The peak of live tensors; None where the step failed."""
    allocator_peak_bytes: int | None = None
    """On CUDA, the caching allocator's allocated peak (`max_memory_allocated()`)."""
    reserved_peak_bytes: int | None = None
    """On CUDA, its reserved peak (`max_memory_reserved()`), without the CUDA runtime."""
    compared_bytes: int | None = None
    """The figure compared with the budget or the card (budget.py): on CUDA the reserved peak plus the CUDA runtime,
    on the CPU the peak."""
    fits: bool | None = None
    """Whether `compared_bytes` fits the budget (or the card, with `gpu` and no budget); None without either."""
    failure: str | None = None
    """Why the step failed at this size, in one line."""
    plan: SweepPlan | None = None
    """With `budget`, where the plain step does not fit: the budget search there; else None."""


@dataclass(frozen=True)
class SweepReport:
    """What `memlayout activations --sweep` reports."""

    axis: str
    """batch or seq."""
    dims: tuple[ScaledDim, ...]
    rows: tuple[SweepRow, ...]
    budget_bytes: int | None
    """What each size is compared with: `budget`, or the card's memory with `gpu`; None without either."""
    budget_from: str | None
    """Where it came from, in words."""
    compared: str
    """The figure of each size compared with it, in words (budget.py)."""
    card_bytes: int | None
    """The target GPU's memory as torch reports it (`total_memory`); None off CUDA."""
    card: str | None
    """The target GPU, as torch names it."""
    planned: bool
    """Each size that does not fit was searched for a plan (`budget` given, a training step)."""
    how: str
    """How the sizes were predicted, in words: which were traced, which evaluated from them, or why none was."""
    report: ActivationReport
    """The plain step at the sweep's smallest size, as one prediction there gives it."""
    fit: FitReport | None = None
    """With `fit`: its answers on the same model."""

    @property
    def traced_sizes(self) -> tuple[int, ...]:
        return tuple(row.size for row in self.rows if row.source == TRACED)

    @property
    def evaluated_sizes(self) -> tuple[int, ...]:
        return tuple(row.size for row in self.rows if row.source == EVALUATED)


def predict_sweep(request: StepRequest) -> SweepReport:
    """The request's `sweep`: the plain step at each size, and with `budget` a plan at each size that needs one.

    Raises:
        SettingError: no input has the dimension the sweep scales, or the inputs disagree on its size.
        UsageError: the step fails at every size of the sweep.
    """
    spec = request.sweep_spec
    specs = [parse_input_spec(s) if isinstance(s, str) else s for s in request.input]
    if not specs or not all(isinstance(s, InputSpec) for s in specs):
        raise SettingError("`sweep` scales the inputs' sizes, so it needs them as `input` specs",
                           "give each input as `input` DTYPE[SHAPE], e.g. `input='int64[1,4096]<32000'`")
    dims, _ = scaled_dims(specs, spec.axis, spec.seq_dim)
    sized = SizedStep(request, specs, dims)
    budget = _budget(request, sized)
    reports: list[ActivationReport] = []
    summaries, failures, untraced = _plain(sized, spec.sizes, reports)
    if not summaries:
        raise failures[spec.sizes[0]]
    report = reports[0] if reports else sized.report(min(summaries))
    planned = request.budget is not None and request.step == "train" and budget is not None
    rows = tuple(_row(sized, size, summaries.get(size), failures.get(size), budget, planned) for size in spec.sizes)
    fit = predict_fit(request, sized=sized) if request.fit is not None else None
    gpu = target_gpu(sized.step)
    return SweepReport(
        axis=spec.axis, dims=dims, rows=rows, budget_bytes=None if budget is None else budget.bytes,
        budget_from=None if budget is None else budget.said,
        compared=(budget or card_budget(gpu) if gpu is not None else Budget(0, "")).describe_figure(),
        card_bytes=None if gpu is None else gpu.total_memory, card=None if gpu is None else gpu.device_name,
        planned=planned, how=_how(sized, spec.axis, spec.sizes, summaries, untraced), report=report, fit=fit,
    )


def _budget(request: StepRequest, sized: SizedStep) -> Budget | None:
    """`budget`, or on a GPU without one its whole memory (as `fit` takes it); None on the CPU without one."""
    gpu = target_gpu(sized.step)
    if request.budget is not None:
        return resolve_budget(request.budget, cuda=sized.cuda, gpu=gpu)
    return card_budget(gpu) if sized.cuda and gpu is not None else None


def _plain(sized: SizedStep, sizes: tuple[int, ...], reports: list[ActivationReport],
           ) -> tuple[dict[int, tuple[Summary, str]], dict[int, UsageError], frozenset[int]]:
    """Each size's plain summary, and how it was had (traced or evaluated); the sizes where the step failed, and of
    those the ones refused untraced (past the model's positions). The report at the smallest size joins `reports`
    while its trace is at hand (traced first, it is not kept long)."""
    summaries: dict[int, tuple[Summary, str]] = {}
    failures: dict[int, UsageError] = {}
    limit = sized.position_limit() if sized.request.sweep_spec.axis == "seq" else None
    if limit is not None:
        name, positions = limit
        for size in sizes:
            if size > positions:
                failures[size] = UsageError(f"{size} tokens are past the model's {name} ({positions}): fake tensors "
                                            "do not check an index against its table, and the real step fails there")
        sizes = tuple(size for size in sizes if size not in failures)
        if not sizes:
            return summaries, failures, frozenset(failures)
    untraced = frozenset(failures)

    def traced(size: int) -> None:
        try:
            summaries[size] = (sized.trace(size)[1], TRACED)
        except UsageError as exc:
            failures[size] = exc
        else:
            if size == sizes[0]:
                reports.append(sized.report(size))

    # The ends first. Where the smallest sizes take another path than the largest (batch 1 often does), each is
    # traced until one agrees with the largest: the laws are fitted from there up.
    low, high = 0, len(sizes) - 1
    traced(sizes[high])
    while low < high:
        traced(sizes[low])
        if sized.laws.same_events(sizes[low], sizes[high]):
            break
        low += 1
    rest = sizes[low:]
    if len(rest) > 3:
        traced(sample_sizes(rest)[2])
    while (wanted := next_sample(sizes, tuple(summaries) + tuple(failures), sized.laws)) is not None:
        traced(wanted)
    for size in sizes:
        if size in summaries or size in failures:
            continue
        evaluated = sized.evaluated(size)
        if evaluated is not None:
            summaries[size] = (evaluated, EVALUATED)
        else:
            traced(size)
    return summaries, failures, untraced


def _row(sized: SizedStep, size: int, had: tuple[Summary, str] | None, failure: UsageError | None,
         budget: Budget | None, planned: bool) -> SweepRow:
    if had is None:
        assert failure is not None
        return SweepRow(size, FAILED, None, failure=failure.one_line())
    summary, source = had
    compared = budget.judged(summary) if budget is not None else summary.peak_bytes
    fits = budget.fits(summary) if budget is not None else None
    plan = _plan(sized, size, budget) if planned and budget is not None and not fits else None
    return SweepRow(size, source, summary.peak_bytes, summary.allocator_peak_bytes, summary.reserved_peak_bytes,
                    compared, fits, plan=plan)


def _plan(sized: SizedStep, size: int, budget: Budget) -> SweepPlan:
    """The `--budget` search at this size, on a trace there (its baseline must carry FLOPs and times)."""
    try:
        trace, summary = sized.trace(size)
        found = plan_for_budget(sized.step, trace, summary, module_facts(trace), budget)
    except BudgetUnreachableError as exc:
        return SweepPlan(False, exc.lowest)
    except UsageError as exc:
        return SweepPlan(False, None, exc.one_line())
    return SweepPlan(True, found)


def _how(sized: SizedStep, axis: str, sizes: tuple[int, ...], summaries: dict[int, tuple[Summary, str]],
         untraced: frozenset[int]) -> str:
    """Which sizes were traced (a failed trace among them) and which evaluated, in words, and why where some were
    not evaluated; a size refused before any trace (`untraced`) is neither."""
    traced = [size for size in sizes if size not in untraced and summaries.get(size, (None, TRACED))[1] == TRACED]
    evaluated = [size for size in sizes if summaries.get(size, (None, ""))[1] == EVALUATED]
    laws = sized.laws
    said = f"traced at {axis} {_sizes_text(traced)}"
    why = [text for text in (laws.broken, laws.differs if laws.broken is None else None, laws.unlawful) if text]
    if evaluated:
        modulus = laws.modulus
        residue = f", in their class modulo {modulus}" if modulus > 1 else ""
        said = (f"{said}; evaluated at {_sizes_text(evaluated)} from the traces around each, whose events agree: "
                f"each storage's bytes on a polynomial of degree 2 or less in the {axis}, checked at a traced size not "
                f"used to fit it, between traced sizes{residue}")
    elif len(sizes) <= 3:
        why.append("a sweep of three sizes or fewer traces each")
    return f"{said}{'; ' if why else ''}{'; '.join(why)}"


def _sizes_text(sizes: list[int]) -> str:
    return ", ".join(str(size) for size in sizes) if sizes else "none"
