"""The activations pipeline: build -> trace -> facts -> plan (traced again to check) -> report data.

By default the model and its inputs are fake tensors (FakeTensorMode): shapes,
dtypes and strides without data, so a 7B model's step is traced in a few
hundred MiB. `mode="meta"` uses meta tensors instead (no device semantics);
`mode="real"` runs the step for real on the device, as a check.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any

from memlayout import _torch
from memlayout.activations.facts import Trace
from memlayout.activations.input_specs import InputSpec, parse_input_spec
from memlayout.activations.optimizer import DEFAULT_OPTIMIZER, build_optimizer, check_optimizer
from memlayout.activations.plan import Plan, Planner
from memlayout.activations.step import LOSS_FROM_SUM, Autocast, run_step
from memlayout.activations.summary import ModuleFacts, Summary, module_facts, summarize
from memlayout.errors import MemlayoutError, UsageError

MODES = ("fake", "meta", "real")
MAX_CHECKS = 6
"""Plans traced again at most per budget, before falling back to the lowest plan."""
PRUNE_CHECKS = 16
"""At most this many more traces to drop what a plan found by tracing does not need."""


@dataclass(frozen=True)
class PlanResult:
    """A plan for a budget, and what tracing it again measured."""

    budget_bytes: int
    plan: Plan
    peak_bytes: int
    """The peak of a trace with the plan applied."""
    allocator_peak_bytes: int | None
    estimated_peak_bytes: int
    """The planner's estimate before that trace."""
    recompute_flops: int
    """Forward FLOPs rerun during backward, counted in the trace with the plan applied."""
    checks: int
    """How many plans were traced to find this one."""
    pitfalls: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...] = ()
    """(module path, why) for each module that cannot be checkpointed and was left out of the search."""


@dataclass(frozen=True)
class ActivationReport:
    """Everything `memlayout activations` reports."""

    target: str | None
    target_kind: str
    model_class: str
    inputs: tuple[str, ...]
    device: str
    mode: str
    loss: str
    optimizer: str
    """adamw, adam, sgd or none: the optimizer whose state and step the peak includes."""
    summary: Summary
    modules: tuple[ModuleFacts, ...]
    plan: PlanResult | None
    notes: tuple[str, ...]
    trace: Trace
    autocast: str | None = None
    """bf16 or fp16 when forward and loss ran under `torch.autocast`; None otherwise."""
    dtype: str | None = None
    """bf16, fp16 or fp32 when the model's floating tensors were cast first (`--dtype`); None: as built."""
    predicted_peak_bytes: int | None = None
    """With mode real: the peak the default fake-tensor run predicts for the same step, to
    read against the measured `summary.peak_bytes`; None otherwise (or if that run failed)."""

    @property
    def data_dependent(self) -> tuple[tuple[str, str, int], ...]:
        """(op, kind, calls) for each op whose output followed an assumption (fake_step.ASSUMPTIONS), not values."""
        return self.trace.assumptions

    @property
    def fallbacks(self) -> tuple[tuple[str, int], ...]:
        """(op, calls) for each op whose fake kernel refused and whose real kernel stood in, in the step traced."""
        return self.trace.fallbacks


class BudgetUnreachableError(MemlayoutError):
    """No plan brings the peak under the budget."""

    def __init__(self, budget: int, lowest: PlanResult) -> None:
        from memlayout.format_bytes import human_bytes

        self.budget_bytes = budget
        self.lowest = lowest
        left_out = (
            f"; {len(lowest.excluded)} modules cannot be checkpointed ({', '.join(p for p, _ in lowest.excluded[:3])}"
            f"{', ...' if len(lowest.excluded) > 3 else ''}: --format json with a reachable --budget says why)"
            if lowest.excluded else ""
        )
        super().__init__(
            f"no checkpoint plan fits a budget of {human_bytes(budget)} ({budget} bytes): the lowest reachable "
            f"peak is {human_bytes(lowest.peak_bytes)} ({lowest.peak_bytes} bytes){left_out}",
            "raise --budget to at least the lowest peak, or shrink the batch",
        )


InputsArg = Sequence[Any] | str | None


class _Step:
    """A model and its inputs in one tensor world (fake, meta or real), ready to trace."""

    def __init__(self, mode: str, device: str) -> None:
        import torch

        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}", "use fake, meta or real")
        if mode == "real" and device == "meta":
            raise UsageError("--real needs a device with memory", "use --device cpu or cuda")
        if device.startswith("cuda") and not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
            raise UsageError(
                "--device cuda needs a torch built with CUDA, even for fake tensors; this one is CPU-only",
                "install a CUDA build of torch, or trace for --device cpu",
            )
        if device.startswith("cuda") and mode == "real" and not torch.cuda.is_available():
            raise UsageError("--real --device cuda needs a CUDA device, and none is available")
        self.mode = mode
        self.device = "meta" if mode == "meta" else device
        self.fake_mode: Any = None
        self.step_mode: Any = None
        if mode == "fake":
            from memlayout.activations.fake_step import FakeStepMode

            self.fake_mode = _torch.FakeTensorMode(allow_non_fake_inputs=True)
            self.step_mode = FakeStepMode(self.fake_mode, keep_values=self.keeps_values)
        self.model: Any = None
        self.initial_modules: frozenset[tuple[str, str]] | None = None
        """(path, class) of every module as built, before any forward: what a plan may name."""
        self.optimizer: Any = None
        self.autocast: Autocast | None = None
        """Mixed precision around forward and loss (`--autocast`)."""
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.descriptions: tuple[str, ...] = ()

    @property
    def keeps_values(self) -> bool:
        """Whether small tensors computed from real ones stay real in a fake step (see fake_step.py): on CPU."""
        return self.mode == "fake" and self.device == "cpu"

    def context(self, *, default_device: bool = True) -> AbstractContextManager[Any]:
        """This world's tensors: where the model is built and its inputs made."""
        import torch

        stack = ExitStack()
        if self.fake_mode is not None:
            stack.enter_context(self.fake_mode)
        if default_device and (self.mode != "real" or self.device != "cpu"):
            stack.enter_context(torch.device(self.device))
        return stack

    def step_context(self, *, default_device: bool = True) -> AbstractContextManager[Any]:
        """Where a step runs: this world, and on fake tensors the values and fallbacks of fake_step.py."""
        stack = ExitStack()
        stack.enter_context(self.context(default_device=default_device))
        if self.step_mode is not None:
            stack.enter_context(self.step_mode)
        return stack

    def cast_inputs(self, dtype: Any) -> None:
        """Floating inputs in `dtype`, as a pure low-precision training loop feeds its model."""
        import torch

        def cast(value: Any) -> Any:
            return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

        with self.context():
            self.args = tuple(cast(a) for a in self.args)
            self.kwargs = {k: cast(v) for k, v in self.kwargs.items()}

    def make_inputs(self, inputs: InputsArg, kwargs: Mapping[str, Any] | None) -> None:
        import torch

        args: list[Any] = []
        named: dict[str, Any] = {}
        descriptions: list[str] = []
        if isinstance(inputs, str):
            from memlayout.load.import_spec import resolve_spec

            with self.context():
                made = resolve_spec(inputs)
            if isinstance(made, torch.Tensor):
                made = (made,)
            if isinstance(made, Mapping):
                named.update(made)
            elif isinstance(made, (tuple, list)):
                args.extend(made)
            else:
                raise UsageError(
                    f"{inputs} returned a {type(made).__name__}",
                    "return a tuple of positional arguments or a dict of keyword arguments",
                )
            descriptions.append(inputs)
        else:
            generator = torch.Generator(device="cpu" if self.mode != "real" else self.device).manual_seed(0)
            for item in inputs or ():
                if isinstance(item, str):
                    item = parse_input_spec(item)
                if isinstance(item, InputSpec):
                    if self.mode == "real" or self._keeps_input(item.nbytes):
                        # real: the model may read its values (a padding mask, lengths); seeded
                        tensor = item.make_tensor(self.device, generator)
                    else:
                        with self.context():
                            tensor = item.make_tensor(self.device, None)
                    if item.name:
                        named[item.name] = tensor
                    else:
                        args.append(tensor)
                    descriptions.append(item.describe())
                else:
                    args.append(item)
                    descriptions.append(_describe(item))
        for name, value in (kwargs or {}).items():
            named[name] = value
            descriptions.append(f"{name}={_describe(value)}")
        self.args = tuple(self._adopt_input(a) for a in args)
        self.kwargs = {k: self._adopt_input(v) for k, v in named.items()}
        self.descriptions = tuple(descriptions)

    def _keeps_input(self, nbytes: int) -> bool:
        from memlayout.activations.fake_step import INPUT_BYTES

        return self.keeps_values and nbytes <= INPUT_BYTES

    def _adopt_input(self, value: Any) -> Any:
        """An input: a real one stays real where the step keeps values and it is not large."""
        import torch

        if isinstance(value, torch.Tensor) and not _is_fake(value) and value.device.type == "cpu" and (
            self._keeps_input(value.untyped_storage().nbytes())
        ):
            return value
        adopted = self._adopt(value)
        if self.keeps_values and isinstance(adopted, torch.Tensor):  # too large to keep: its values are still inputs'
            self.step_mode.mark_from_inputs(adopted, adopted.untyped_storage().nbytes())
        return adopted

    def _adopt(self, value: Any, *, place: bool = True) -> Any:
        """A real tensor given by the caller, converted to this world's tensors.

        With `place`, a fake tensor is also put on the step's device, as the caller's
        `.to(device)` of an input would; a model's tensors are placed together
        afterwards (`place_fake_model`), so that views of one storage stay one.
        """
        import torch

        if not isinstance(value, torch.Tensor):
            return value
        if self.mode == "real":
            # --real on CUDA: the model was moved there, so its inputs go too.
            return value.to(self.device) if place and value.device.type != torch.device(self.device).type else value
        if self.fake_mode is not None:
            fake = value if _is_fake(value) else self.fake_mode.from_tensor(value)
            if place and fake.device.type != torch.device(self.device).type:
                with self.fake_mode:
                    fake = fake.to(self.device)
            return fake
        return value.to("meta")

    def adopt_model(self, model: Any) -> Any:
        """A copy of a live model in this world's tensors (the caller's model is never run or changed)."""
        import torch

        memo: dict[int, Any] = {}
        for tensor in list(model.parameters()) + list(model.buffers()):
            if id(tensor) in memo:
                continue
            if self.mode == "real":
                continue
            converted = self._adopt(tensor.detach(), place=False)
            if isinstance(tensor, torch.nn.Parameter):
                converted = torch.nn.Parameter(converted, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = converted
        with self.context():
            return copy.deepcopy(model, memo)

    def add_optimizer(self, name: str) -> None:
        """Build the optimizer and give it the state it has from the second step of training on.

        The first step runs untraced (forward, backward, `optimizer.step()`), so that only the
        parameters that get a gradient have state, as in training. Its `step()` runs without
        the default-device context: torch keeps an optimizer's step counts on the CPU.
        """
        with self.context():
            self.optimizer = build_optimizer(self.model, name, device=self.device)
        if self.optimizer is None:
            return
        with self.step_context():
            run_step(self.model, self.args, self.kwargs, autocast=self.autocast)
        with self.step_context(default_device=False):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def trace(self, plan: Plan | None = None, policy: str = "typical") -> Trace:
        from memlayout.activations.apply import apply_plan
        from memlayout.activations.trace import trace_step

        for parameter in self.model.parameters():
            parameter.grad = None
        with ExitStack() as stack:
            notes: tuple[str, ...] = ()
            if plan is not None and not plan.empty:
                applied = stack.enter_context(apply_plan(self.model, plan))
                notes = tuple(applied.notes)
            stack.enter_context(self.step_context() if self.mode != "real" else nullcontext())
            if self.step_mode is not None:
                self.step_mode.fallbacks.clear()
                self.step_mode.assumed.clear()
                self.step_mode.policy = policy
            trace = trace_step(
                self.model, self.args, self.kwargs, device=self.device, mode=self.mode, notes=notes,
                optimizer=self.optimizer, autocast=self.autocast,
            )
        for parameter in self.model.parameters():
            parameter.grad = None
        if self.step_mode is not None:
            self.step_mode.policy = "typical"
            trace = dataclasses.replace(
                trace,
                fallbacks=tuple(sorted(self.step_mode.fallbacks.items())),
                assumptions=tuple((op, kind, count) for (op, kind), count in sorted(self.step_mode.assumed.items())),
            )
        return trace


def _is_fake(value: Any) -> bool:
    return isinstance(value, _torch.FakeTensor)


def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{','.join(str(int(d)) for d in value.shape)}]"
    return type(value).__name__


def analyze(
    target: Any,
    inputs: InputsArg = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    budget: int | None = None,
    device: str = "cpu",
    mode: str = "fake",
    trust: bool = False,
    optimizer: str = DEFAULT_OPTIMIZER,
    autocast: str | None = None,
    dtype: str | None = None,
    main_module: str | None = None,
) -> ActivationReport:
    """Trace one training step of a model and report its activation memory (and a plan for `budget`).

    Args:
        target: An nn.Module (copied, never run), or a TARGET string: `pkg.mod:build`,
            a Hugging Face model directory or config.json, or a pickled module (`trust=True`).
        inputs: Positional inputs: tensors, `InputSpec`s or spec strings
            (`"int64[4,128]<50257"`, `"labels=int64[4,128]<50257"`); or a
            `pkg.mod:make_inputs` spec returning a tuple or a dict.
        kwargs: Keyword inputs (tensors).
        budget: Bytes the step's peak must fit in; adds a checkpoint plan.
        device: The device the step is for: cpu, cuda or meta.
        mode: fake (default, no memory), meta, or real (runs the step on `device`).
        trust: Allow unpickling a module file.
        optimizer: adamw (default), adam, sgd (momentum 0.9) or none: the optimizer whose
            state and `step()` the peak includes (see optimizer.py).
        autocast: bf16 or fp16: forward and loss under `torch.autocast` for the device's
            type, with that device's op lists (CPU's differ from CUDA's); None for none.
        dtype: bf16, fp16 or fp32: cast the model's floating parameters, buffers and inputs first,
            as pure low-precision training does; the optimizer's state then follows the
            parameters' dtype (torch's optimizers keep no float32 copy). None keeps the model's.
        main_module: With `trust`, the module that defines the classes a pickled module
            saved from a script names as `__main__.X`.

    Returns:
        An `ActivationReport`.

    Raises:
        BudgetUnreachableError: no plan fits `budget`; it names the lowest peak reached.
        UsageError: the model cannot be built or stepped on these inputs, or the arguments are wrong.
        ActivationsError: anything else: memlayout's own failure, still one line.
    """
    try:
        return _analyze(target, inputs, kwargs=kwargs, budget=budget, device=device, mode=mode, trust=trust,
                        optimizer=optimizer, autocast=autocast, dtype=dtype, main_module=main_module)
    except MemlayoutError:
        raise
    except Exception as exc:
        from memlayout.activations.build import where

        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ActivationsError(f"the analysis stopped: {type(exc).__name__}: {text} (at {where(exc)})") from exc


def _analyze(
    target: Any,
    inputs: InputsArg,
    *,
    kwargs: Mapping[str, Any] | None,
    budget: int | None,
    device: str,
    mode: str,
    trust: bool,
    optimizer: str,
    autocast: str | None = None,
    dtype: str | None = None,
    main_module: str | None = None,
) -> ActivationReport:
    import torch

    from memlayout.activations.step import Autocast, torch_dtype

    if device == "meta":
        mode = "meta" if mode != "real" else mode
    check_optimizer(optimizer)
    if autocast is not None and autocast not in ("bf16", "fp16"):
        raise UsageError(f"unknown --autocast {autocast!r}", "use bf16 or fp16")
    cast_to = torch_dtype(dtype) if dtype is not None else None
    step = _Step(mode, device)
    if autocast is not None:
        step.autocast = Autocast("cuda" if device.startswith("cuda") else "cpu", autocast)
    notes: list[str] = []
    if isinstance(target, torch.nn.Module):
        step.model = step.adopt_model(target)
        target_text, kind = None, "module"
    else:
        from memlayout.activations.build import build_model

        built = build_model(
            str(target), trust=trust, main_module=main_module, context=step.context, world=step.mode, device=step.device,
            adopt=step.adopt_model,
        )
        step.model = built.model
        notes.extend(built.notes)
        target_text, kind = str(target), built.kind.kind
    step.model.train()
    step.initial_modules = frozenset((path, type(m).__name__) for path, m in step.model.named_modules())
    if step.device not in ("cpu", "meta"):
        if step.mode == "real":
            with step.context():
                step.model.to(step.device)
        else:
            from memlayout.activations.build import place_fake_model

            notes.extend(place_fake_model(step.model, step.device, step.context))
    if cast_to is not None:
        from memlayout.activations.build import cast_model

        cast_model(step.model, cast_to, step.mode, step.device, step.context)
    step.make_inputs(inputs, kwargs)
    if cast_to is not None:
        step.cast_inputs(cast_to)
    if not step.args and not step.kwargs:
        raise UsageError("no inputs to run the step with", _inputs_hint(step.model))
    try:
        step.add_optimizer(optimizer)
        baseline = step.trace()
    except MemlayoutError:
        raise
    except Exception as exc:  # the model's own forward or backward failed on these inputs
        raise _step_failed(exc, step) from exc
    if baseline.loss == LOSS_FROM_SUM:
        notes.append(
            "the output has no loss, so backward starts from the sum of its floating outputs; a real loss "
            "(e.g. labels=... for a Hugging Face model) adds its own temporaries"
        )
    if step.mode == "meta":
        notes.append(
            "meta tensors have no device: kernels a device chooses (oneDNN's LSTM on CPU, fused attention) are "
            "not the ones traced; --device cpu or cuda traces those"
        )
    if dtype in ("bf16", "fp16") and optimizer != "none":
        notes.append(f"the optimizer's state is {dtype}, as torch's {optimizer} keeps it (each state tensor is "
                     "zeros_like its parameter); an optimizer that keeps float32 master weights or state needs more")
    summary = summarize(baseline, cuda=step.device.startswith("cuda"))
    if baseline.assumptions:
        summary = _with_range(step, summary)
    modules = module_facts(baseline)
    plan = _plan(step, baseline, summary, modules, budget) if budget is not None else None
    predicted = None
    if step.mode == "real":
        # --real is a check of the prediction, so it makes the prediction too: the same
        # target and inputs, traced on fake tensors as a run without --real traces them.
        # A step that reads values fails on fake tensors (that is when --real is the hint):
        # the real report stands, and says there is no prediction to read it against.
        try:
            predicted = analyze(target, inputs, kwargs=kwargs, device=device, trust=trust, optimizer=optimizer,
                                autocast=autocast, dtype=dtype, main_module=main_module).summary.peak_bytes
        except MemlayoutError as exc:
            notes.append(f"no prediction to compare with: on fake tensors, {exc.one_line()}")
    return ActivationReport(
        target=target_text,
        target_kind=kind,
        model_class=type(step.model).__name__,
        inputs=step.descriptions,
        device=step.device,
        mode=step.mode,
        loss=baseline.loss,
        optimizer=optimizer,
        summary=summary,
        modules=modules,
        plan=plan,
        notes=tuple(notes),
        trace=baseline,
        autocast=autocast,
        dtype=dtype,
        predicted_peak_bytes=predicted,
    )


def _inputs_hint(model: Any) -> str:
    """How to give inputs: read off a Hugging Face model's config where it has one, else the general form."""
    from memlayout.activations.input_specs import suggested_inputs

    suggested = suggested_inputs(model)
    if suggested:
        flags = " ".join(f"--input '{spec.describe()}'" for spec in suggested)
        return f"e.g. {flags}, from {type(model).__name__}'s config; or --inputs pkg.mod:make_inputs"
    return ("give --input DTYPE[SHAPE] once per input, name=DTYPE[SHAPE] for a keyword input, e.g. "
            "'float32[8,3,224,224]' for images or 'int64[4,128]<50257' for token ids below 50257; "
            "or --inputs pkg.mod:make_inputs")


def _with_range(step: _Step, summary: Summary) -> Summary:
    """The summary with the peak's range over the assumptions' extremes (fake_step.ASSUMPTIONS)."""
    from memlayout.activations.assumptions import POLICIES

    cuda = step.device.startswith("cuda")
    peaks = [summary.peak_bytes] + [
        summarize(step.trace(policy=policy), cuda=cuda).peak_bytes for policy in POLICIES if policy != "typical"
    ]
    return dataclasses.replace(summary, peak_bytes_min=min(peaks), peak_bytes_max=max(peaks))


def _step_failed(exc: Exception, step: _Step) -> UsageError:
    from memlayout.activations.build import value_read, where

    read = value_read(exc)
    if read is not None:
        return UsageError(f"the step reads a value that {step.mode} tensors do not have: {read.describe()}; "
                          f"{_why_no_value(exc, step)}", "pass --real to run the step for real (it takes the memory)")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return UsageError(
        f"the step failed: {type(exc).__name__}: {text} (at {where(exc)})",
        "check the inputs' shapes and dtypes against the model's forward (--debug shows the traceback)",
    )


def _why_no_value(exc: BaseException, step: _Step) -> str:
    """Why the value read is not there: the weights decide it, or the inputs do but it was not kept."""
    from memlayout.activations.fake_step import VALUE_BYTES, ValueFromInputsError
    from memlayout.format_bytes import human_bytes

    if not step.keeps_values:
        where = "" if step.mode == "meta" else f" for {step.device}"
        return f"a {step.mode} step{where} keeps no values, not even those of the inputs"
    current: BaseException | None = exc
    while current is not None and not isinstance(current, ValueFromInputsError):
        current = current.__cause__ or current.__context__
    if current is not None:
        return (f"it follows from the inputs alone, through a tensor of {human_bytes(current.tensor_bytes)}, more "
                f"than the {human_bytes(VALUE_BYTES)} a fake step computes for real")
    return "a value computed from the weights has none without running them"


class ActivationsError(MemlayoutError):
    """memlayout could not finish an analysis for a reason of its own, not the model's."""

    default_hint = "rerun with --debug for the traceback, and report it: it is memlayout's failure, not your model's"


class _Excluded(Exception):
    """A traced plan failed; the modules to blame are now in the exclusions, and the search starts again."""


def _plan(
    step: _Step, baseline: Trace, summary: Summary, modules: tuple[ModuleFacts, ...], budget: int
) -> PlanResult:
    if budget < 0:
        raise UsageError(f"the budget {budget} is negative")
    cuda = step.device.startswith("cuda")
    excluded = exclusions(modules, baseline, step.initial_modules)
    if summary.peak_bytes <= budget:
        return PlanResult(budget, Plan(), summary.peak_bytes, summary.allocator_peak_bytes, summary.peak_bytes, 0, 0,
                          (), tuple(excluded.items()))
    checked: dict[Plan, Summary] = {Plan(): summary}
    estimates: dict[Plan, int] = {Plan(): summary.peak_bytes}

    def trace(plan: Plan) -> Summary:
        """The plan's traced summary; a plan whose step fails names its modules in `excluded`."""
        if plan in checked:
            return checked[plan]
        try:
            traced = step.trace(plan)
        except MemlayoutError:
            raise
        except Exception as exc:
            _blame(plan, exc, trace, excluded)
            raise _Excluded() from exc
        if traced.rerun_state_differs:
            _exclude_unfaithful(plan, traced.rerun_state_differs, excluded)
            raise _Excluded()
        checked[plan] = summarize(traced, cuda=cuda)
        return checked[plan]

    def result(plan: Plan, measured: Summary) -> PlanResult:
        return PlanResult(
            budget_bytes=budget,
            plan=plan,
            peak_bytes=measured.peak_bytes,
            allocator_peak_bytes=measured.allocator_peak_bytes,
            estimated_peak_bytes=estimates.get(plan, measured.peak_bytes),
            recompute_flops=measured.recompute_flops,
            checks=len(checked) - 1,
            pitfalls=pitfalls(plan, modules, step.model),
            excluded=tuple(excluded.items()),
        )

    for _ in range(len(modules) + 1):  # each round excludes at least one module
        planner = Planner(baseline, excluded)
        try:
            found = _search(planner, budget, trace, estimates)
        except _Excluded:
            continue
        if found is not None:
            return result(found, checked[found])
        break
    plan, measured = min(checked.items(), key=lambda item: (item[1].peak_bytes, item[1].recompute_flops))
    raise BudgetUnreachableError(budget, result(plan, measured))


def _search(
    planner: Planner, budget: int, trace: Callable[[Plan], Summary], estimates: dict[Plan, int]
) -> Plan | None:
    """The cheapest plan found whose traced peak fits the budget, or None."""

    def check(chosen: list[int]) -> tuple[Plan, Summary]:
        plan = planner.plan_of(chosen)
        estimates.setdefault(plan, planner.estimate(chosen))
        return plan, trace(plan)

    target = budget
    for _ in range(MAX_CHECKS):
        chosen = planner.search(target)
        if chosen is None:
            break
        plan, measured = check(chosen)
        if measured.peak_bytes <= budget:
            return plan
        # The estimate was short by this much: aim lower by the same amount.
        target -= max(measured.peak_bytes - budget, 1)
    # Before calling the budget unreachable, trace what the estimate cannot judge:
    # its own lowest plan, and every module of one level checkpointed together.
    candidates = [planner.lowest(), *planner.covers()]
    results = [(chosen, *check(chosen)) for chosen in candidates]
    fitting = [(chosen, plan, measured) for chosen, plan, measured in results if measured.peak_bytes <= budget]
    if not fitting:
        return None
    chosen, plan, measured = min(fitting, key=lambda item: (item[2].recompute_flops, item[2].peak_bytes))
    # A whole-level plan checkpoints modules the budget does not need (two of eight
    # residual blocks reach what all eight do): drop each while the traced peak
    # still fits, the costliest and the latest in the model first.
    for row in sorted(chosen, key=lambda r: (-planner.options[r].flops, -r))[:PRUNE_CHECKS]:
        trial = [r for r in chosen if r != row]
        if not trial:
            continue
        trial_plan, trial_measured = check(trial)
        if trial_measured.peak_bytes <= budget:
            chosen, plan, measured = trial, trial_plan, trial_measured
    return plan


def exclusions(
    modules: tuple[ModuleFacts, ...], trace: Trace, initial_modules: frozenset[tuple[str, str]] | None
) -> dict[str, str]:
    """module path -> why it cannot be checkpointed, from what the baseline trace saw it do."""
    excluded: dict[str, str] = {}
    for m in modules:
        if not m.path:
            continue
        if initial_modules is not None and (m.path, m.class_name) not in initial_modules:
            excluded[m.path] = (
                "created during forward: a model built afresh does not have it yet, so a plan cannot name it"
            )
        elif m.mutates_inputs:
            excluded[m.path] = "writes in place into a tensor it received: its rerun would start from the changed values"
        elif m.changes_state is not None:
            inner, _, what = m.changes_state.partition(": ")
            who = "its forward changes" if inner == m.path else f"{inner} inside it changes"
            excluded[m.path] = (
                f"{who} {what} (plain Python state): a rerun in backward would see the changed state, not the one "
                "forward saw"
            )
    return excluded


def _blame(plan: Plan, exc: Exception, trace: Callable[[Plan], Summary], excluded: dict[str, str]) -> None:
    """Find which modules of a failing plan fail alone, and exclude them (all of them if none fails alone)."""
    singles = [Plan(checkpoint=(path,)) for path in plan.checkpoint] + [Plan(sequential=(s,)) for s in plan.sequential]
    if len(singles) > 1:
        blamed = {}
        for single in singles:
            try:
                trace(single)
            except _Excluded:
                blamed.update({p: excluded[p] for p in _paths(single) if p in excluded})
        if blamed:
            return
    reason = _failure_reason(exc)
    others = _paths(plan)
    for path in others:
        excluded[path] = reason if len(others) == 1 else f"checkpointed together with {', '.join(others)}: {reason}"


def _exclude_unfaithful(plan: Plan, differs: tuple[tuple[str, str], ...], excluded: dict[str, str]) -> None:
    """Exclude each checkpointed module whose rerun started a module inside it from other state than forward
    did: the step runs without an error, but its gradients are those of another computation."""
    for checkpointed in _paths(plan):
        for path, what in differs:
            if path == checkpointed or path.startswith(checkpointed + ".") or not checkpointed:
                where = "" if path == checkpointed else f"in {path}, "
                excluded[checkpointed] = (
                    f"its rerun is no replay: {where}{what} (state kept on the module, which checkpoint does not "
                    "restore)"
                )
                break


def _paths(plan: Plan) -> list[str]:
    return list(plan.checkpoint) + [s.module for s in plan.sequential]


def _failure_reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if type(exc).__name__ == "CheckpointError":
        return (
            f"its recompute differs from its forward (torch.utils.checkpoint raised CheckpointError: {text}); a "
            "shape computed from state that changes between forward and recompute does this"
        )
    return f"checkpointed, the step raised {type(exc).__name__}: {text}"


def pitfalls(plan: Plan, modules: tuple[ModuleFacts, ...], model: Any) -> tuple[str, ...]:
    """The checkpoint pitfalls that apply to this plan's modules, one sentence each."""
    if plan.empty:
        return ()
    paths = list(plan.checkpoint) + [s.module for s in plan.sequential]

    def inside(path: str) -> list[ModuleFacts]:
        return [m for m in modules if path == "" or m.path == path or m.path.startswith(path + ".")]

    found: list[str] = [
        "wrap with use_reentrant=False (apply_plan does): the reentrant variant does not work with "
        "torch.autograd.grad, only with .backward()",
    ]

    def flagged(check: Callable[[ModuleFacts], bool]) -> list[str]:
        return [p or "the model" for p in paths if any(check(m) for m in inside(p))]

    if hit := flagged(lambda m: m.reads_outside_state):
        found.append(
            f"{', '.join(hit)}: reads tensors that are not its inputs, parameters or buffers (global or cached "
            "state); if that state changes before backward, the rerun computes something else and the gradients "
            "are silently wrong"
        )
    if hit := flagged(lambda m: m.moves_device):
        found.append(
            f"{', '.join(hit)}: moves tensors to another device; checkpoint restores the RNG state only of its "
            "inputs' devices, so random ops on the other device draw differently on the rerun"
        )
    if hit := flagged(lambda m: m.mutates_buffers):
        found.append(
            f"{', '.join(hit)}: updates buffers in forward (e.g. BatchNorm running statistics); the rerun updates "
            "them a second time"
        )
    if hit := flagged(lambda m: m.uses_randomness):
        found.append(
            f"{', '.join(hit)}: uses randomness (dropout); checkpoint stashes and restores the RNG state so the "
            "rerun draws the same mask, which costs time; keep preserve_rng_state=True there"
        )
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        found.append(
            "Hugging Face models need use_cache=False under checkpoint (apply_plan sets model.config.use_cache "
            "= False): a layer that appends to a key/value cache appends again when it reruns"
        )
    return tuple(found)
