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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout.activations.analysis import ActivationReport
from memlayout.activations.budget import BudgetSpec
from memlayout.activations.fit.probes import (
    DeviceProbe,
    FitProbe,
    Probe,
    RanksProbe,
    ScaledDim,
    TracedFloor,
)
from memlayout.activations.model.adapt import Adaptation
from memlayout.activations.model.adapters import LoraOptions
from memlayout.activations.model.input_specs import INTEGRAL, InputSpec, parse_input_spec
from memlayout.activations.ranks.facts import RanksReport
from memlayout.activations.search import PlanResult
from memlayout.activations.step.run import resolve_step, serving_ranks_refused
from memlayout.errors import (
    NothingFitsError,
    UsageError,
)
from memlayout.format_bytes import human_bytes

if TYPE_CHECKING:
    from memlayout.activations.ranks.facts import RanksPlan
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.activations.step.generate import Generation

AXES = ("batch", "seq")
FLOOR_REACH = 16
"""Where `--fit` traces the lowest plan first: this many times the size after the plain answer, far enough that
the activations, which a plan's floor grows with, outweigh what does not grow (the optimizer's step)."""
MAX_SIZE = 1 << 24
"""The search stops growing here: a model whose step fits this many samples or tokens fits more than anyone asks."""
RULE = (
    "batch scales dim 0 of every --input with a dimension; seq scales dim 1 of every integer --input with two or "
    "more (token ids, labels, masks), or with seq:N dim N of every --input that has it"
)


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


def parse_axis(text: str) -> tuple[str, int | None]:
    """`batch`, `seq` or `seq:N` -> (axis, named seq dim or None)."""
    axis, _, dim = text.partition(":")
    if axis not in AXES or (dim and (axis != "seq" or not dim.isdigit() or int(dim) < 1)):
        raise UsageError(f"--fit {text!r} is not batch, seq or seq:N", RULE)
    return axis, int(dim) if dim else None


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
        raise UsageError(f"--fit {what}: no --input has the dimension it scales", RULE)
    sizes = {spec.shape[dim] for spec, dim in chosen}
    if len(sizes) > 1:
        shown = ", ".join(f"{spec.describe()} dim {dim}" for spec, dim in chosen)
        raise UsageError(f"--fit {what}: the inputs disagree on its size ({shown})",
                         "give every input the same batch (or sequence) size")
    return tuple(ScaledDim(spec.describe(), dim) for spec, dim in chosen), sizes.pop()


def largest_fitting(
    probe: Callable[[int], FitProbe], start: int, *, known_fit: int = 0, anchor: tuple[int, int] | None = None,
    floor: tuple[int, int] | None = None, budget: int, cap: int = MAX_SIZE,
) -> int:
    """The largest n in [1, cap] whose probe fits, or `known_fit` (0: none known) when none above it does.

    A bracketing search: grow from `start` until a probe does not fit, then narrow the
    bracket. Each next size comes from the straight line through the two probed peaks
    nearest the budget (`anchor`, a size and peak known without a probe, stands in for
    the second at first), since a step's peak grows nearly linearly with its batch;
    once that has twice failed to halve the bracket, the search bisects, so it never
    takes more probes than plain bisection after growth by doubling would, plus two.
    An estimated guide (a plan found: see FitProbe.guide) steers only the growth; the
    probe is assumed to fit at every size below one that fits.

    `floor`, a size and a traced figure there on the line a planned step's lowest figure
    grows along (the planner's lowest plan, traced far above the answer), draws the first
    line with the anchor: the first probe is where that line reaches the budget. While
    every probe fits, the search then checks the size after the line's crossing once,
    and doubles after that: a planned probe that fits traces no floor, so the line
    cannot learn from it.
    """
    peaks: dict[int, int] = {}
    """size -> a traced figure (the anchor's is known)."""
    estimates: dict[int, int] = {}
    """size -> an estimated one: steers the growth, and only until a size does not fit."""
    if anchor is not None:
        peaks[anchor[0]] = anchor[1]
    low, high = known_fit, None
    size = min(max(start, known_fit + 1, 1), cap)
    line = None if floor is None or anchor is None else _reach(anchor, floor, budget)
    if floor is not None:
        peaks[floor[0]] = floor[1]
    if line is not None:
        size = min(max(line, known_fit + 1, 1), cap)
    passed = False
    slow, bisecting = 0, False
    while True:
        result = probe(size)
        # An estimate at or over the budget where a plan was found to fit is contradicted by the trace: the
        # estimates run ahead of the step.
        ahead = result.fits and not result.guide_measured and result.guide is not None and result.guide >= budget
        if result.guide is not None and not ahead:
            (peaks if result.guide_measured else estimates)[size] = result.guide
        width = None if high is None else high - low
        if result.fits:
            low = size
        else:
            high = size
        if high is not None and high - low <= 1:
            return low
        if high is None and low >= cap:
            return low
        guess = _crossing(peaks if high is not None else {**estimates, **peaks}, low, high, budget)
        if high is None:
            grown = max(2 * low, low + 1)
            if line is not None:
                size = min(cap, grown if passed else low + 1)
                passed = True
                continue
            if ahead:  # on the estimates below it the search would crawl (the 1.1B Llama in float32 on an
                guess = None  # A100 40GB probed 9, 10, ..., 17): double instead
            size = min(cap, max(low + 1, min(guess, 16 * grown) if guess is not None else grown))
            continue
        slow = slow + 1 if width is not None and high - low > width // 2 else 0
        # Twice the line did not halve the bracket: the peak curves away from it (a peak quadratic in the
        # sequence), so the search bisects from here on.
        bisecting = bisecting or slow >= 2
        if guess is None or bisecting:
            size = (low + high) // 2
        else:
            size = min(max(guess, low + 1), high - 1)


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


def fit(
    target: Any,
    inputs: Sequence[str | InputSpec],
    *,
    axis: str = "batch",
    seq_dim: int | None = None,
    budget: int | float | BudgetSpec | None = None,
    gpu: str | None = None,
    device: str = "cpu",
    step: str = "train",
    optimizer: str | None = None,
    autocast: str | None = None,
    dtype: str | None = None,
    sharding: ShardingOptions | None = None,
    with_plan: bool = True,
    trust: bool = False,
    main_module: str | None = None,
    model_class: str | None = None,
    generation: Generation | None = None,
    lora: LoraOptions | int | None = None,
    quantize: str | None = None,
) -> FitReport:
    """The largest batch (or longest sequence) whose step's peak fits `budget`, with and without a plan.

    Args:
        target: An nn.Module or a TARGET string, as for `analyze`.
        inputs: `--input` specs (strings or `InputSpec`s) at any size; the scaled dimension is
            read off them (see the module's docstring) and the size given is where the search starts.
        axis: batch or seq.
        seq_dim: With axis seq, the dimension to scale in every input that has it; None: dim 1 of
            the integer inputs.
        budget: What each size must fit in: bytes (each rank's peak with `sharding`), or a share of the target
            GPU's memory (a float in (0, 1]); None: the target GPU's whole memory. On CUDA the reserved peak
            plus the CUDA runtime is compared with it (budget.py).
        gpu: The target GPU (a key of device/gpus.py): the step is traced for it, and its memory is the
            budget when none is given.
        device: The device the step is for (cpu, cuda or meta); the step is traced on fake tensors.
        step: train, inference (forward only; then there is no plan to search) or generate (with
            `generation`: seq is then the longest prompt, batch the most sequences, that generate fits).
        optimizer: As for `analyze`.
        autocast: As for `analyze` (not with `sharding`).
        dtype: As for `analyze` (not with `sharding`).
        sharding: Predict ranks (FSDP2, tensor parallel): the peak is the largest rank's.
        with_plan: Also search the largest size the budget search's plan fits.
        trust: Allow unpickling a module file.
        main_module: With `trust`, the module for a script's `__main__.X` classes.
        model_class: As for `analyze`.
        generation: With step generate, its new tokens and cache (step/generate.py).
        lora: As for `analyze`: peft's LoRA adapters, only they train.
        quantize: As for `analyze`: the base quantized with bitsandbytes.

    Returns:
        A `FitReport`.

    Raises:
        NothingFitsError: not even a size of 1 fits.
        UsageError: no input has the dimension, the budget is below the weights, or bad arguments.
    """
    if axis not in AXES:
        raise UsageError(f"unknown fit axis {axis!r}", RULE)
    specs = [parse_input_spec(s) if isinstance(s, str) else s for s in inputs]
    if not specs or not all(isinstance(s, InputSpec) for s in specs):
        raise UsageError("--fit scales the inputs' sizes, so it needs them as --input specs",
                         "give each input as --input DTYPE[SHAPE], e.g. --input 'int64[1,4096]<32000'")
    dims, given = scaled_dims(specs, axis, seq_dim)
    if isinstance(budget, int):
        budget = BudgetSpec(bytes=budget)
    elif isinstance(budget, float):
        budget = BudgetSpec(fraction=budget)
    optimizer = resolve_step(step, optimizer, None)
    if (step == "generate") != (generation is not None):
        raise UsageError("--step generate and its --new-tokens go together", "e.g. --step generate --new-tokens 256")
    inference = step != "train"
    adaptation = Adaptation(lora=LoraOptions(lora) if isinstance(lora, int) else lora, quantize=quantize)
    if sharding is not None:
        if not adaptation.empty:
            raise UsageError(f"{'--quantize' if quantize else '--lora'} is not traced with --world-size yet")
        if inference:
            raise serving_ranks_refused(step)
        if autocast or dtype:
            raise UsageError(f"{'--autocast' if autocast else '--dtype'} is not traced with --world-size yet")
        probe: Probe = RanksProbe(target, specs, dims, sharding=sharding, optimizer=optimizer, budget=budget,
                                    device=device, trust=trust, main_module=main_module, model_class=model_class)
    else:
        probe = DeviceProbe(target, specs, dims, budget=budget, device=device, optimizer=optimizer,
                             autocast=autocast, dtype=dtype, step_kind=step, trust=trust, main_module=main_module,
                             gpu=gpu, adaptation=adaptation, generation=generation, model_class=model_class)
    limit_bytes = probe.budget.bytes
    cap, limit = MAX_SIZE, None
    if axis == "seq":
        positions = probe.position_limit()
        if positions is not None:
            cap, limit = positions[1], f"the model's {positions[0]} ({positions[1]})"
    probes: list[FitProbe] = []
    plain: dict[int, FitProbe] = {}
    planned: dict[int, FitProbe] = {}

    def probe_plain(size: int) -> FitProbe:
        if size not in plain:
            plain[size] = probe.plain(size)
            probes.append(plain[size])
        return plain[size]

    # Remedies name only what the command did not already do: a bf16 run is not told to use bf16.
    half_precision = dtype in ("bf16", "fp16")
    first = probe.plain(given)  # a failure at the size given is the inputs' fault: it propagates
    plain[given] = first
    probes.append(first)
    # The model's own state at size 0, and on CUDA the runtime beside it: the line's anchor.
    weights = probe.state_bytes() + (probe.budget.runtime_bytes or 0)
    if weights >= limit_bytes:
        runtime = " and the CUDA runtime beside it" if probe.budget.runtime_bytes else ""
        raise UsageError(
            f"the budget {human_bytes(limit_bytes)} ({limit_bytes} bytes) is below the model's own state{runtime}, "
            f"{human_bytes(weights)} ({weights} bytes: parameters, buffers"
            f"{', optimizer state' if optimizer != 'none' else ''}): no {axis} fits",
            "raise --budget" if half_precision else "raise --budget, or use lower precision (--dtype bf16)",
        )
    size = largest_fitting(probe_plain, given, anchor=(0, weights), budget=limit_bytes, cap=cap)
    without = _answer(size, plain.get(size), plain.get(size + 1), cap, limit)
    # Taken now: the planned search traces other sizes, and a probe keeps only its latest traces.
    report = probe.report_at(max(size, 1))
    with_answer, floor = None, None
    if with_plan and not inference:
        def probe_planned(n: int) -> FitProbe:
            if n not in planned:
                planned[n] = probe.planned(n)
                probes.append(planned[n])
            return planned[n]

        # Above the plain answer only: every size up to it fits with the empty plan, which is what the budget
        # search returns there. A plan leaves the model's state as it is, so the state at size 0 anchors the
        # line with the plan as it does without.
        # The lowest plan's figure grows nearly in a line from the state at 0 once the activations outweigh the
        # optimizer's step (Llama-7B at 4,096 tokens on an H100: 72.0 GB at batch 2 and 6, the optimizer's peak;
        # 88.0 GB at 13 and 174.6 GB at 37, within 0.1 GB of the line). Traced once far above the plain answer,
        # it aims the first budget search near the answer, rather than a search at every size on the way.
        # Where nothing fits without a plan, a size of 1 decides whether anything does with one before a floor is
        # worth tracing (a 1.1B Llama at 2,048 tokens in 16 GiB of CPU: the floor at 16 aimed the search at 3, 15
        # traces and 34.0 s for an answer of 0 that batch 1 gives in 4 traces and 11.8 s).
        known = 1 if size == 0 and probe_planned(1).fits else size
        far = min(cap, FLOOR_REACH * (known + 1))
        floor = probe.floor(far) if known and far > known + 1 else None
        best = 0 if not known else largest_fitting(
            probe_planned, known + 1, known_fit=known, anchor=(0, weights),
            floor=None if floor is None else (floor.size, floor.compared_bytes), budget=limit_bytes, cap=cap)
        plan = probe.plan_at(best) if best else None
        at = planned.get(best) or plain.get(best)
        with_answer = dataclasses.replace(_answer(best, at, planned.get(best + 1), cap, limit), plan=plan)
        if isinstance(plan, PlanResult) and best in planned:  # the probe's plan, pruned: its own peak
            with_answer = dataclasses.replace(with_answer, peak_bytes=plan.peak_bytes,
                                              compared_bytes=plan.compared_bytes)
    if without.size == 0 and (with_answer is None or with_answer.size == 0):
        lowest = [p.judged_bytes for p in probes if p.size == 1 and p.judged_bytes is not None]
        raise NothingFitsError(axis, limit_bytes, min(lowest) if lowest else None,
                               half_precision=half_precision, ranks=sharding is not None)
    return FitReport(
        axis=axis, dims=dims, given_size=given, budget_bytes=limit_bytes, budget_from=probe.budget.said,
        compared=probe.budget.describe_figure(), without_plan=without, with_plan=with_answer, probes=tuple(probes),
        limit=limit if without.size == cap else None, report=report, floor=floor,
    )


def _answer(size: int, at: FitProbe | None, after: FitProbe | None, cap: int, limit: str | None) -> FitAnswer:
    failure = after.failure if after is not None else None
    if after is None and size >= cap:
        failure = f"the search stops at {cap}: {limit}" if limit else f"the search stops at {cap}"
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
