"""The tensor world a step is traced in: a model and its inputs as fake, meta or real tensors.

`StepWorld` builds the model's inputs, adopts a live model into the world, gives it the
optimizer state of a running training loop, and traces one step, with or without a plan.
The single-rank analysis (analysis.py) and the fake ranks (ranks/) both trace through it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

from memlayout import _torch
from memlayout.activations.device.gpus import DEFAULT_GPU, GpuSpec, gpu_spec, spec_for_device_name
from memlayout.activations.device.roofline import Roofline, cpu_roofline, gpu_roofline
from memlayout.activations.facts import Trace
from memlayout.activations.model.input_specs import InputSpec, parse_input_spec
from memlayout.activations.plans.apply import apply_plan
from memlayout.activations.plans.op_policies import on_top_of
from memlayout.activations.plans.plan import Plan
from memlayout.activations.step.generate import Generation
from memlayout.activations.step.optimizer import build_optimizer
from memlayout.activations.step.recipe import Recipe
from memlayout.activations.step.run import Autocast, give_first_gradients, run_step
from memlayout.activations.trace.fake_cuda import fake_cuda_for, give_torch_fake_cuda
from memlayout.activations.trace.module_conversions import unchanged_conversions_skip_the_swap
from memlayout.errors import UsageError

MODES = ("fake", "meta", "real")

InputsArg = Sequence[Any] | str | None


def device_for_gpu(device: str, mode: str, gpu: str | GpuSpec | None) -> str:
    """`--gpu` names the GPU a fake CUDA step is for: it implies --device cuda.

    Raises:
        UsageError: an unknown name (first), --real, or a --device that is not CUDA.
    """
    if gpu is None:
        return device
    if isinstance(gpu, str):
        gpu_spec(gpu)  # an unknown name is the first thing to say
    if mode == "real":
        raise UsageError("`gpu` names a GPU to trace for, and `real` measures the one present",
                         "drop `gpu`, or drop `real`")
    if device in ("cpu", "cuda") or device.startswith("cuda:"):
        return "cuda" if device == "cpu" else device
    raise UsageError(f"`gpu` traces for a CUDA device, and `device` is {device}", "drop `device`, or `gpu`")


class StepWorld:
    """A model and its inputs in one tensor world (fake, meta or real), ready to trace."""

    def __init__(self, mode: str, device: str, gpu: str | GpuSpec | None = None) -> None:
        import torch

        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}", "use fake, meta or real")
        if mode == "real" and device == "meta":
            raise UsageError("`real` needs a device with memory", "use `device` cpu or cuda")
        if device.startswith("cuda") and mode == "real" and not torch.cuda.is_available():
            raise UsageError("`real` `device` cuda needs a CUDA device, and none is available")
        if device.startswith("cuda") and mode == "fake":
            give_torch_fake_cuda()
        self.mode = mode
        self.device = "meta" if mode == "meta" else device
        self.fake_mode: Any = None
        self.step_mode: Any = None
        self.fake_cuda: Any = None
        """Makes a fake CUDA step run as on the target GPU where none is present (fake_cuda.py), or None."""
        if mode == "fake":
            from memlayout.activations.trace.fake_step import FakeStepMode

            self.fake_mode = _torch.FakeTensorMode(allow_non_fake_inputs=True)
            self.step_mode = FakeStepMode(self.fake_mode, keep_values=self.keeps_values)
            if device.startswith("cuda"):
                self.fake_cuda = fake_cuda_for(gpu)
        self.model: Any = None
        self.initial_modules: frozenset[tuple[str, str]] | None = None
        """(path, class) of every module as built, before any forward: what a plan may name."""
        self.optimizer: Any = None
        self.autocast: Autocast | None = None
        """Mixed precision around forward and loss (`--autocast`)."""
        self.recipe = Recipe()
        """The optimizer's implementation and gradient clipping (`--optimizer-impl`, `--clip-grad-norm`)."""
        self.user_plan: Plan | None = None
        """The checkpointing the user asks for (`--ac-modules`, `--selective-ac`): applied in every trace."""
        self.inference = False
        """Forward only, under `torch.inference_mode` (`--step inference`)."""
        self.generation: Generation | None = None
        """`model.generate` instead of one forward (`--step generate`; set by `generate`)."""
        self.adapted: Any = None
        """What `--quantize` and `--lora` did to the model (model/adapt.py's Adapted), or None."""
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.descriptions: tuple[str, ...] = ()

    def generate(self, generation: Generation) -> None:
        """Make the step `model.generate`, in eval mode, with a fake step's rules for it (trace/generate_mode.py)."""
        self.generation = generation
        self.inference = True
        if self.step_mode is not None:
            from memlayout.activations.trace.generate_mode import GenerateStepMode

            # On a device that is not here, generate's loop reads its values from twins on the CPU (fake_step.py).
            self.step_mode = GenerateStepMode(self.fake_mode, keep_values=self.keeps_values,
                                              values_on_device=None if self.keeps_values else self.device.split(":")[0])

    @functools.cached_property
    def roofline(self) -> Roofline:
        """The target's peak rates, to price a checkpointed module's rerun (device/roofline.py): the target GPU's
        datasheet on CUDA (the present GPU's row, or the default's when the table lacks it), this machine's
        measured rates on the CPU, the default GPU's for meta tensors, which have no device."""
        import torch

        if self.device == "cpu":
            return cpu_roofline()
        if self.fake_cuda is not None:
            return gpu_roofline(self.fake_cuda.gpu)
        if self.device.startswith("cuda") and torch.cuda.is_available():
            present = spec_for_device_name(torch.cuda.get_device_name(torch.device(self.device)))
            if present is not None:
                return gpu_roofline(present)
        return gpu_roofline(gpu_spec(DEFAULT_GPU))

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
        if self.fake_mode is not None:
            stack.enter_context(unchanged_conversions_skip_the_swap())
        if self.fake_cuda is not None:
            stack.enter_context(self.fake_cuda())
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
                    if self.mode == "real" or self._keeps_input(item.nbytes) or self._twins_input(item.nbytes):
                        # real: the model may read its values (a padding mask, lengths); seeded. On a device that
                        # is not here, made on the CPU, to be the fake input's twin (`_adopt_input`).
                        tensor = item.make_tensor("cpu" if self._twins_input(item.nbytes) else self.device, generator)
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
        from memlayout.activations.trace.fake_step import INPUT_BYTES

        return self.keeps_values and nbytes <= INPUT_BYTES

    def _twins_input(self, nbytes: int) -> bool:
        """Whether an input's values go with it as a real twin (a generate step for a device that is not here)."""
        from memlayout.activations.trace.fake_step import INPUT_BYTES

        return self.step_mode is not None and self.step_mode.values_on_device is not None and nbytes <= INPUT_BYTES

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
        if (isinstance(value, torch.Tensor) and not _is_fake(value) and value.device.type == "cpu"
                and self._twins_input(value.untyped_storage().nbytes())):
            self.step_mode.twins.give(adopted, value)
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

        The first step runs untraced, so that only the parameters that get a gradient have state,
        as in training. On fake or meta tensors it is forward, then a zero gradient for each
        parameter the loss's graph reaches (`give_first_gradients`: backward is not needed to
        know which), then `optimizer.step()`; on real tensors, a whole step, which also warms
        the kernels' caches as a first step does. Its `step()` runs without the default-device
        context: torch keeps an optimizer's step counts on the CPU.
        """
        with self.context():
            self.optimizer = build_optimizer(self.model, name, device=self.device,
                                             implementation=self.recipe.optimizer_impl)
        if self.optimizer is None:
            return
        with self.step_context():
            if self.mode == "real":
                run_step(self.model, self.args, self.kwargs, autocast=self.autocast)
            else:
                give_first_gradients(self.model, self.args, self.kwargs, autocast=self.autocast)
        with self.step_context(default_device=False):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def trace(self, plan: Plan | None = None, policy: str = "typical", kept: Sequence[Any] = ()) -> Trace:
        """One step traced, with `plan` applied; `kept`: communication buffers kept outside the model (tracer.py)."""
        from memlayout.activations.trace.tracer import trace_step

        for parameter in self.model.parameters():
            parameter.grad = None
        plan = on_top_of(self.user_plan, plan)
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
                if self.generation is not None:
                    stack.enter_context(self.step_mode.watching(self.model))
            trace = trace_step(self, notes, kept)
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
