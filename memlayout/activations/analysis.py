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
from memlayout.activations.step import LOSS_FROM_SUM, run_step
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
        super().__init__(
            f"no checkpoint plan fits a budget of {human_bytes(budget)} ({budget} bytes): the lowest reachable "
            f"peak is {human_bytes(lowest.peak_bytes)} ({lowest.peak_bytes} bytes)",
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
        self.optimizer: Any = None
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
        return self._adopt(value)

    def _adopt(self, value: Any) -> Any:
        """A real tensor given by the caller, converted to this world's tensors."""
        import torch

        if not isinstance(value, torch.Tensor) or self.mode == "real":
            return value
        if self.fake_mode is not None:
            return value if _is_fake(value) else self.fake_mode.from_tensor(value)
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
            converted = self._adopt(tensor.detach())
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
            run_step(self.model, self.args, self.kwargs)
        with self.step_context(default_device=False):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def trace(self, plan: Plan | None = None) -> Trace:
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
            trace = trace_step(
                self.model, self.args, self.kwargs, device=self.device, mode=self.mode, notes=notes,
                optimizer=self.optimizer,
            )
        for parameter in self.model.parameters():
            parameter.grad = None
        if self.step_mode is not None and self.step_mode.fallbacks:
            trace = dataclasses.replace(trace, fallbacks=tuple(sorted(self.step_mode.fallbacks.items())))
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

    Returns:
        An `ActivationReport`.

    Raises:
        BudgetUnreachableError: no plan fits `budget`; it names the lowest peak reached.
    """
    import torch

    if device == "meta":
        mode = "meta" if mode != "real" else mode
    check_optimizer(optimizer)
    step = _Step(mode, device)
    notes: list[str] = []
    if isinstance(target, torch.nn.Module):
        step.model = step.adopt_model(target)
        target_text, kind = None, "module"
    else:
        from memlayout.activations.build import build_model

        built = build_model(
            str(target), trust=trust, context=step.context, world=step.mode, device=step.device,
            adopt=step.adopt_model,
        )
        step.model = built.model
        notes.extend(built.notes)
        target_text, kind = str(target), built.kind.kind
    step.model.train()
    if step.device not in ("cpu", "meta"):
        with step.context():
            step.model.to(step.device)
    step.make_inputs(inputs, kwargs)
    if not step.args and not step.kwargs:
        raise UsageError(
            "no inputs to run the step with",
            "give --input 'float32[8,3,224,224]' (repeatable; name=... for keyword inputs) or --inputs pkg.mod:make_inputs",
        )
    try:
        step.add_optimizer(optimizer)
        baseline = step.trace()
    except MemlayoutError:
        raise
    except Exception as exc:  # the model's own forward or backward failed on these inputs
        raise UsageError(
            f"the step failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "check the inputs' shapes and dtypes against the model's forward (--debug shows the traceback)",
        ) from exc
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
    summary = summarize(baseline, cuda=step.device.startswith("cuda"))
    modules = module_facts(baseline)
    plan = _plan(step, baseline, summary, modules, budget) if budget is not None else None
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
    )


def _plan(
    step: _Step, baseline: Trace, summary: Summary, modules: tuple[ModuleFacts, ...], budget: int
) -> PlanResult:
    if budget < 0:
        raise UsageError(f"the budget {budget} is negative")
    cuda = step.device.startswith("cuda")
    if summary.peak_bytes <= budget:
        return PlanResult(budget, Plan(), summary.peak_bytes, summary.allocator_peak_bytes, summary.peak_bytes, 0, 0, ())
    planner = Planner(baseline)
    checked: dict[Plan, Summary] = {}
    rows_of: dict[Plan, list[int]] = {}

    def check(chosen: list[int]) -> tuple[Plan, Summary]:
        plan = planner.plan_of(chosen)
        if plan not in checked:
            checked[plan] = summarize(step.trace(plan), cuda=cuda)
            rows_of[plan] = chosen
        return plan, checked[plan]

    def result(chosen: list[int], plan: Plan, measured: Summary) -> PlanResult:
        return PlanResult(
            budget_bytes=budget,
            plan=plan,
            peak_bytes=measured.peak_bytes,
            allocator_peak_bytes=measured.allocator_peak_bytes,
            estimated_peak_bytes=planner.estimate(chosen),
            recompute_flops=measured.recompute_flops,
            checks=len(checked),
            pitfalls=pitfalls(plan, modules, step.model),
        )

    target = budget
    for _ in range(MAX_CHECKS):
        chosen = planner.search(target)
        if chosen is None:
            break
        plan, measured = check(chosen)
        if measured.peak_bytes <= budget:
            return result(chosen, plan, measured)
        # The estimate was short by this much: aim lower by the same amount.
        target -= max(measured.peak_bytes - budget, 1)
    # Before calling the budget unreachable, trace what the estimate cannot judge:
    # its own lowest plan, and every module of one level checkpointed together.
    for chosen in (planner.lowest(), *planner.covers()):
        check(chosen)
    fitting = [(plan, measured) for plan, measured in checked.items() if measured.peak_bytes <= budget]
    if fitting:
        plan, measured = min(fitting, key=lambda item: (item[1].recompute_flops, item[1].peak_bytes))
        chosen = rows_of[plan]
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
        return result(chosen, plan, measured)
    plan, measured = min(checked.items(), key=lambda item: (item[1].peak_bytes, item[1].recompute_flops))
    raise BudgetUnreachableError(budget, result(rows_of[plan], plan, measured))


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
