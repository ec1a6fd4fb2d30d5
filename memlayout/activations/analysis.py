"""The activations pipeline: build -> trace -> facts -> plan (traced again to check) -> report data.

By default the model and its inputs are fake tensors (FakeTensorMode): shapes,
dtypes and strides without data, so a 7B model's step is traced in a few
hundred MiB. `mode="meta"` uses meta tensors instead (no device semantics);
`mode="real"` runs the step for real on the device, as a check.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from memlayout.activations.assumptions import POLICIES, UNRANGED
from memlayout.activations.budget import Budget, resolve_budget
from memlayout.activations.device.gpus import GpuSpec, requested_gpu, spec_for_device_name
from memlayout.activations.facts import Trace
from memlayout.activations.generate_summary import GenerateSummary, summarize_generation
from memlayout.activations.model.adapt import Adapted, adapt_model, adaptation_of
from memlayout.activations.model.adapters import ParameterSplit, parameter_split
from memlayout.activations.model.build import (
    TensorMover,
    build_model,
    cast_model,
    place_fake_model,
    value_read,
    where,
)
from memlayout.activations.model.compiled import eager_model
from memlayout.activations.model.input_specs import suggested_inputs
from memlayout.activations.plans.op_policies import user_plan
from memlayout.activations.request.alternatives import hint as alternatives_hint
from memlayout.activations.request.alternatives import predicted
from memlayout.activations.request.python_call import call_request
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.activations.search import PlanResult, plan_for_budget
from memlayout.activations.sizes import BudgetSpec
from memlayout.activations.step.generate import check_can_generate, generation_of
from memlayout.activations.step.optimizer import state_dtype
from memlayout.activations.step.recipe import recipe_of
from memlayout.activations.step.run import Autocast, torch_dtype
from memlayout.activations.step_notes import step_notes
from memlayout.activations.summary import ModuleFacts, Summary, module_facts, summarize
from memlayout.activations.trace.world import InputsArg, StepWorld, device_for_gpu
from memlayout.errors import (
    ActivationsError,
    BudgetUnreachableError,
    MemlayoutError,
    SettingError,
    UsageError,
)
from memlayout.format_bytes import human_bytes

LIVE_MODULE = "the module given"
"""`class_chosen_by` of a model passed to `analyze` as an nn.Module."""


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
    optimizer_state_dtype: str | None = None
    """The dtype of the optimizer's state as torch made it (float32, bfloat16, ...; see
    `optimizer.state_dtype`); None without state."""
    predicted_peak_bytes: int | None = None
    """With mode real: the peak the default fake-tensor run predicts for the same step, to
    read against the measured `summary.peak_bytes`; None otherwise (or if that run failed)."""
    step: str = "train"
    """train (forward, loss, backward, the optimizer's step) or inference (forward only, under
    `torch.inference_mode`, the model in eval mode): see request/vocabulary.py's STEPS."""
    cuda_capability: tuple[int, int] | None = None
    """(major, minor) of the GPU a CUDA step was traced for (`--gpu`, the GPU present, or the
    default assumed without one); it sizes cuBLAS's workspaces (device/cuda_runtime.py). None off CUDA."""
    class_chosen_by: str = ""
    """Why the model is a `model_class`: a config's architectures, `--model-class`, the model type's head
    with a loss (model/hf_class.py), the factory that returned it, the file it was pickled in."""
    generation: GenerateSummary | None = None
    """A generate step's weights, key/value cache and temporaries at the peak (generate_summary.py); else None."""
    roofline: str | None = None
    """Whose peak rates priced each op's time (device/roofline.py), in words; None where not priced."""
    parameters: ParameterSplit | None = None
    """The parameters that train against those frozen (LoRA's adapters against its base)."""
    adapted: Adapted | None = None
    """What `--quantize` and `--lora` did to the model; None when neither was asked for."""

    @property
    def data_dependent(self) -> tuple[tuple[str, str, int], ...]:
        """(op, kind, calls) for each op whose output followed an assumption (fake_step.ASSUMPTIONS), not values."""
        return self.trace.assumptions

    @property
    def fallbacks(self) -> tuple[tuple[str, int], ...]:
        """(op, calls) for each op whose fake kernel refused and whose real kernel stood in, in the step traced."""
        return self.trace.fallbacks


def analyze(target: Any, inputs: InputsArg = None, *, kwargs: Mapping[str, Any] | None = None,
            **settings: Any) -> ActivationReport:
    """Trace one training step of a model and report its activation memory (and a plan for `budget`).

    Args:
        target: An nn.Module (copied, never run), or a TARGET string: `pkg.mod:build`,
            a Hugging Face model directory or config.json, or a pickled module (`trust=True`).
        inputs: Positional inputs: tensors, `InputSpec`s or spec strings
            (`"int64[4,128]<50257"`, `"labels=int64[4,128]<50257"`); or a
            `pkg.mod:make_inputs` spec returning a tuple or a dict.
        kwargs: Keyword inputs (tensors).
        settings: Any setting of `StepRequest` (request/step_request.py) by name, each as its field's docstring
            says; those a step reads most:
            `budget`: what the step must fit in; adds a checkpoint plan. Bytes (an int, or "8GiB"), or a share
            of the target GPU's memory (a float in (0, 1], as torch reports it: `total_memory`). On the CPU the
            live tensors' peak is compared with it; on CUDA the caching allocator's reserved peak plus the CUDA
            context and workspaces (budget.py).
            `device`: cpu, cuda or meta. `real`: run the step for real on `device` (or `mode="real"`).
            `optimizer`: adamw (the default for a training step), adam, sgd (momentum 0.9) or none
            (step/optimizer.py); an inference step has none.
            `autocast`: bf16 or fp16, forward and loss under `torch.autocast` with the device's op lists.
            `dtype`: bf16, fp16 or fp32 (or bfloat16, ...): the model's floating parameters, buffers and
            inputs cast first, as pure low-precision training does; the optimizer's state follows them.
            `trust`, `main_module`, `model_class`: how TARGET is built (model/target.py, model/hf_class.py).
            `gpu`: the GPU to trace for (a key of activations/device/gpus.py: h100, a100-80gb, ...); implies
            device cuda. Where no GPU is present and none is named, an H100 is assumed.
            `step`: train, inference (forward only, under `torch.inference_mode`, eval mode) or generate
            (`model.generate(inputs, max_new_tokens=new_tokens, do_sample=False)`; step/generate.py), with
            `new_tokens` and `cache` (dynamic or static).
            `lora` (a rank, or `LoraOptions`), `lora_targets`, `lora_dropout`, `dora`: peft's adapters before
            tracing, only they train (model/adapters.py); `quantize`: nf4, fp4 or int8, the base quantized
            with bitsandbytes (model/quantize.py), with `lora` QLoRA.

    Returns:
        An `ActivationReport`.

    Raises:
        BudgetUnreachableError: no plan fits `budget`; it names the lowest peak reached.
        SettingError: settings that do not go together, named as here.
        UsageError: the model cannot be built or stepped on these inputs.
        ActivationsError: anything else: memlayout's own failure, still one line.
    """
    return predict_step(call_request(target, inputs, kwargs, Pipeline.STEP, settings))


def predict_step(request: StepRequest) -> ActivationReport:
    """One step of the request's model on one device, and a checkpoint plan for its `budget` (see `analyze`)."""
    try:
        return _predicted(request)
    except MemlayoutError:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ActivationsError(f"the analysis stopped: {type(exc).__name__}: {text} (at {where(exc)})") from exc


def _predicted(request: StepRequest) -> ActivationReport:
    step, notes, target_text, kind, chosen_by = prepare_step(request)
    resolved = step_budget(step, request.budget)  # a budget the target cannot take is refused before tracing
    try:
        baseline = step.trace()
    except MemlayoutError:
        raise
    except Exception as exc:  # the model's own forward or backward failed on these inputs
        raise _step_failed(exc, step) from exc
    notes.extend(step_notes(request, step, baseline))
    summary = summarize(baseline, cuda=step.device.startswith("cuda"))
    if any(kind not in UNRANGED for _, kind, _ in baseline.assumptions):
        summary = _with_range(step, summary)
    modules = module_facts(baseline)
    try:
        plan = plan_for_budget(step, baseline, summary, modules, resolved) if resolved is not None else None
    except BudgetUnreachableError as exc:
        assert resolved is not None  # the search ran
        nothing_fits_hint(request, step, resolved, exc)
        raise
    generation = generation_of(request)
    predicted = _prediction(request, notes) if step.mode == "real" else None
    return ActivationReport(
        target=target_text, target_kind=kind, model_class=type(step.model).__name__, inputs=step.descriptions,
        device=step.device, mode=step.mode, loss=baseline.loss, optimizer=request.step_optimizer, summary=summary,
        modules=modules, plan=plan, notes=tuple(notes), trace=baseline, autocast=request.autocast,
        dtype=request.dtype, optimizer_state_dtype=state_dtype(step.optimizer),
        predicted_peak_bytes=predicted, step=request.step,
        cuda_capability=_cuda_capability(step), class_chosen_by=chosen_by,
        generation=summarize_generation(baseline, generation) if generation is not None else None,
        roofline=roofline_text(step), parameters=parameter_split(step.model), adapted=step.adapted,
    )


def nothing_fits_hint(request: StepRequest, step: StepWorld, budget: Budget, exc: BudgetUnreachableError) -> None:
    """Give `exc` what to try when no plan fits: what the request did not already do, the lowest-cost first, each
    with the figure its step would give at this batch (request/alternatives.py), then raising the budget, and
    shrinking the batch only where it is above 1. A plan was already searched (that is how this came to be asked).
    """
    exc.alternatives = predicted(request, lambda changed: _plain_figure(changed, budget))
    tail = ["raise `budget` to at least the lowest figure"]
    batch = _batch(step)
    if batch is not None and batch > 1:
        tail.append(f"shrink the batch (it is {batch})")
    exc.hint = alternatives_hint(exc.alternatives, "at the inputs given", tail)


def _plain_figure(request: StepRequest, budget: Budget) -> int:
    """The figure `budget` compares of the request's step traced once, without a plan (and never for real)."""
    return budget.judged(predict_step(replace(request, budget=None, real=False)).summary)


def _batch(step: StepWorld) -> int | None:
    """The leading size of the step's first input tensor (an input's batch), None where there is none."""
    import torch

    for value in (*step.args, *step.kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return None


def _prediction(request: StepRequest, notes: list[str]) -> int | None:
    """With `real`, the peak the same step predicts on fake tensors, to read the real one against.

    `real` is a check of the prediction, so it makes the prediction too: the same target and inputs, traced
    on fake tensors as a request without `real` traces them. A step that reads values fails on fake tensors
    (that is when `real` is the hint): the real report stands, and says there is no prediction to read it against.
    """
    try:
        return predict_step(replace(request, real=False, budget=None)).summary.peak_bytes
    except MemlayoutError as exc:
        notes.append(f"no prediction to compare with: on fake tensors, {exc.one_line()}")
        return None


def roofline_text(step: StepWorld) -> str:
    """The roofline that priced the step's ops, in words: "NVIDIA H100 80GB HBM3 (NVIDIA's datasheet, dense)"."""
    return f"{step.roofline.device} ({step.roofline.source})"


def step_budget(step: StepWorld, budget: int | float | BudgetSpec | None) -> Budget | None:
    """The budget for this step's target: bytes, or a share of its GPU's memory; on CUDA compared with the
    reserved peak plus the CUDA runtime (budget.py)."""
    if isinstance(budget, float):
        budget = BudgetSpec(fraction=budget)
    return resolve_budget(budget, cuda=step.device.startswith("cuda"), gpu=target_gpu(step))


def target_gpu(step: StepWorld) -> GpuSpec | None:
    """The GPU a CUDA step is for: the one traced for where none is present, else the present one's row."""
    if not step.device.startswith("cuda"):
        return None
    if step.fake_cuda is not None:
        gpu: GpuSpec = step.fake_cuda.gpu
        return gpu
    import torch

    if not torch.cuda.is_available():
        return None
    return spec_for_device_name(torch.cuda.get_device_name(torch.device(step.device)))


def _cuda_capability(step: StepWorld) -> tuple[int, int] | None:
    """The target GPU's compute capability: the one traced for where none is present, else the present one's."""
    import torch

    if not step.device.startswith("cuda") or (step.fake_cuda is None and not torch.cuda.is_available()):
        return None
    if step.fake_cuda is not None:
        capability: tuple[int, int] = step.fake_cuda.gpu.capability
        return capability
    major, minor = torch.cuda.get_device_capability(torch.device(step.device))
    return (major, minor)


class PreparedStep(NamedTuple):
    """A step ready to trace, and what building it said."""

    world: StepWorld
    notes: list[str]
    target_text: str | None
    """The target as given; None for a live module."""
    kind: str
    class_chosen_by: str
    """Why the model is of its class (`ActivationReport.class_chosen_by`)."""


def prepare_step(request: StepRequest, *, inputs: InputsArg = None, mode: str | None = None,
                 optimizer: str | None = None) -> PreparedStep:
    """The request's model built in its tensor world, its inputs made, its optimizer's state given: ready to trace.

    `inputs`, `mode` and `optimizer` stand in for the request's (`step_inputs`, `mode`, `step_optimizer`): `--fit`
    makes the inputs at each size, and DDP's ranks give the optimizer its state in steps of their own.
    """
    mode = request.mode if mode is None else mode
    gpu = requested_gpu(request.gpu, request.gpu_memory)
    step = StepWorld(mode, device_for_gpu(request.device, mode, gpu), gpu)
    if request.autocast is not None:
        step.autocast = Autocast("cuda" if step.device.startswith("cuda") else "cpu", request.autocast)
    step.recipe = recipe_of(request)
    notes: list[str] = []
    with step.fake_cuda.building() if step.fake_cuda is not None else contextlib.nullcontext():
        target_text, kind, chosen_by = _build_into(step, request, notes)
    _adapt(step, request, notes)
    step.user_plan = user_plan(step.model, request.ac_modules, request.selective_ac)
    step.initial_modules = frozenset((path, type(m).__name__) for path, m in step.model.named_modules())
    step.make_inputs(request.step_inputs if inputs is None else inputs, request.kwargs)
    if request.dtype is not None:
        step.cast_inputs(torch_dtype(request.dtype))
    if not step.args and not step.kwargs:
        raise SettingError("no inputs to run the step with", _inputs_hint(step.model))
    try:
        step.add_optimizer(request.step_optimizer if optimizer is None else optimizer)
    except MemlayoutError:
        raise
    except Exception as exc:  # the model's own forward or backward failed on these inputs
        raise _step_failed(exc, step) from exc
    return PreparedStep(step, notes, target_text, kind, chosen_by)


def _build_into(step: StepWorld, request: StepRequest, notes: list[str]) -> tuple[str | None, str, str]:
    """The request's model, built (or a live module adopted) in the step's world, placed on its device: the
    target as text (None for a module), its kind, and why it is of its class."""
    import torch

    if isinstance(request.target, torch.nn.Module):
        step.model = eager_model(step.adopt_model(request.target), request.eager)
        return None, "module", LIVE_MODULE
    built = build_model(request.model_target, context=step.context, world=step.mode, device=step.device,
                        adopt=step.adopt_model)
    step.model = eager_model(built.model, request.eager)
    notes.extend(built.notes)
    return str(request.target), built.kind.kind, built.class_chosen_by


def _adapt(step: StepWorld, request: StepRequest, notes: list[str]) -> None:
    """What comes between building and tracing, in order: generate's setup, the device, the `dtype` cast, the
    adapters, and the train or eval mode of the step's kind."""
    generation = generation_of(request)
    if generation is not None:
        check_can_generate(step.model)
        step.generate(generation)
        notes.append(generation.note())
    if step.fake_cuda is not None:
        step.fake_cuda.refuse_what_no_build_traces(step.model)
    if step.device not in ("cpu", "meta"):
        if step.mode == "real":
            with step.context():
                step.model.to(step.device)
        else:
            notes.extend(place_fake_model(step.model, step.device, step.context))
    if request.dtype is not None:
        cast_model(step.model, torch_dtype(request.dtype), step.mode, step.device, step.context)
    adaptation = adaptation_of(request)
    if not adaptation.empty:
        mover = TensorMover(step.mode, step.device, step.context)
        # The step's context: peft's `.to()` of each adapter is a conversion that changes nothing, which fake
        # parameters cannot swap outside it (trace/module_conversions.py).
        step.model, step.adapted = adapt_model(step.model, adaptation, world=step.mode, device=step.device,
                                               move=mover.move, context=step.step_context)
    step.model.train()
    if request.step in ("inference", "generate"):
        step.model.eval()  # as serving code runs it: dropout off, norms on their running statistics
        step.inference = True


def _inputs_hint(model: Any) -> str:
    """How to give inputs: read off a Hugging Face model's config where it has one, else the general form."""
    suggested = suggested_inputs(model)
    if suggested:
        flags = " ".join(f"`input='{spec.describe()}'`" for spec in suggested)
        return f"e.g. {flags}, from {type(model).__name__}'s config; or `inputs=pkg.mod:make_inputs`"
    return ("give `input=DTYPE[SHAPE]` once per input, name=DTYPE[SHAPE] for a keyword input, e.g. "
            "'float32[8,3,224,224]' for images or 'int64[4,128]<50257' for token ids below 50257; "
            "or `inputs=pkg.mod:make_inputs`")


def _with_range(step: StepWorld, summary: Summary) -> Summary:
    """The summary with the peak's range over the assumptions' extremes (fake_step.ASSUMPTIONS)."""
    cuda = step.device.startswith("cuda")
    peaks = [summary.peak_bytes, *(summarize(step.trace(policy=p), cuda=cuda).peak_bytes for p in POLICIES
                                   if p != "typical")]
    return dataclasses.replace(summary, peak_bytes_min=min(peaks), peak_bytes_max=max(peaks))


def _step_failed(exc: Exception, step: StepWorld) -> UsageError:
    read = value_read(exc)
    if read is not None:
        return UsageError(f"the step reads a value that {step.mode} tensors do not have: {read.describe()}; "
                          f"{_why_no_value(exc, step)}",
                          "pass `real=True` to run the step for real (it takes the memory)")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return UsageError(f"the step failed on {type(step.model).__name__}: {type(exc).__name__}: {text} (at {where(exc)})",
                      "check the inputs' shapes and dtypes against the model's forward (--debug shows the traceback)")


def _why_no_value(exc: BaseException, step: StepWorld) -> str:
    """Why the value read is not there: the weights decide it, or the inputs do but it was not kept."""
    from memlayout.activations.trace.fake_step import VALUE_BYTES, ValueFromInputsError

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


