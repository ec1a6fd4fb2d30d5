"""The activations pipeline: build -> trace -> facts -> plan (traced again to check) -> report data.

By default the model and its inputs are fake tensors (FakeTensorMode): shapes,
dtypes and strides without data, so a 7B model's step is traced in a few
hundred MiB. `mode="meta"` uses meta tensors instead (no device semantics);
`mode="real"` runs the step for real on the device, as a check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memlayout.activations.assumptions import POLICIES, UNRANGED
from memlayout.activations.budget import Budget, BudgetSpec, resolve_budget
from memlayout.activations.device.gpus import GpuSpec, spec_for_device_name
from memlayout.activations.facts import Trace
from memlayout.activations.generate_summary import GenerateSummary, summarize_generation
from memlayout.activations.model.adapt import Adaptation, Adapted, adapt_model
from memlayout.activations.model.adapters import LoraOptions, ParameterSplit, parameter_split
from memlayout.activations.model.build import (
    TensorMover,
    build_model,
    cast_model,
    place_fake_model,
    value_read,
    where,
)
from memlayout.activations.model.input_specs import suggested_inputs
from memlayout.activations.search import PlanResult, plan_for_budget
from memlayout.activations.step.generate import Generation, check_can_generate, check_generation
from memlayout.activations.step.optimizer import check_optimizer, state_dtype
from memlayout.activations.step.run import LOSS_FROM_SUM, Autocast, resolve_step, torch_dtype
from memlayout.activations.summary import ModuleFacts, Summary, module_facts, summarize
from memlayout.activations.trace.world import InputsArg, StepWorld, device_for_gpu
from memlayout.errors import ActivationsError, MemlayoutError, UsageError
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
    `torch.inference_mode`, the model in eval mode): see step/run.py's STEPS."""
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


def analyze(
    target: Any,
    inputs: InputsArg = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    budget: int | float | BudgetSpec | None = None,
    device: str = "cpu",
    mode: str = "fake",
    trust: bool = False,
    optimizer: str | None = None,
    autocast: str | None = None,
    dtype: str | None = None,
    main_module: str | None = None,
    gpu: str | None = None,
    step: str = "train",
    model_class: str | None = None,
    new_tokens: int | None = None,
    cache: str | None = None,
    lora: LoraOptions | int | None = None,
    quantize: str | None = None,
) -> ActivationReport:
    """Trace one training step of a model and report its activation memory (and a plan for `budget`).

    Args:
        target: An nn.Module (copied, never run), or a TARGET string: `pkg.mod:build`,
            a Hugging Face model directory or config.json, or a pickled module (`trust=True`).
        inputs: Positional inputs: tensors, `InputSpec`s or spec strings
            (`"int64[4,128]<50257"`, `"labels=int64[4,128]<50257"`); or a
            `pkg.mod:make_inputs` spec returning a tuple or a dict.
        kwargs: Keyword inputs (tensors).
        budget: What the step must fit in; adds a checkpoint plan. Bytes (an int), or a share of the
            target GPU's memory (a float in (0, 1], as torch reports it: `total_memory`). On the CPU the
            live tensors' peak is compared with it; on CUDA the caching allocator's reserved peak plus
            the CUDA context and workspaces (budget.py).
        device: The device the step is for: cpu, cuda or meta.
        mode: fake (default, no memory), meta, or real (runs the step on `device`).
        trust: Allow unpickling a module file.
        optimizer: adamw (the default for a training step), adam, sgd (momentum 0.9) or none: the
            optimizer whose state and `step()` the peak includes (see step/optimizer.py). An inference
            step has none.
        autocast: bf16 or fp16: forward and loss under `torch.autocast` for the device's
            type, with that device's op lists (CPU's differ from CUDA's); None for none.
        dtype: bf16, fp16 or fp32: cast the model's floating parameters, buffers and inputs first,
            as pure low-precision training does; the optimizer's state then follows the
            parameters' dtype (torch's optimizers keep no float32 copy). None keeps the model's.
        main_module: With `trust`, the module that defines the classes a pickled module
            saved from a script names as `__main__.X`.
        gpu: The GPU to trace for (a key of activations/device/gpus.py: h100, a100-80gb, ...); implies
            device="cuda". Where no GPU is present and none is named, an H100 is assumed.
        step: train (forward, loss, backward, the optimizer's step), inference (forward only,
            under `torch.inference_mode`, the model in eval mode; no budget, no optimizer) or generate
            (`model.generate(inputs, max_new_tokens=new_tokens, do_sample=False)` in that mode; step/generate.py).
        model_class: The transformers class a config builds (`T5ForConditionalGeneration`, or an auto
            class such as `AutoModelForSeq2SeqLM`); None: the config's architectures, else the model
            type's first head with a loss (model/hf_class.py).
        new_tokens: With step generate, how many tokens to generate (required there, refused elsewhere).
        cache: With step generate, dynamic (the default, transformers' DynamicCache) or static.
        lora: LoRA adapters by peft before tracing: a rank, or `LoraOptions` (targets, dropout, DoRA); every
            setting not given is `peft.LoraConfig()`'s default. Only the adapters train (model/adapters.py).
        quantize: nf4, fp4 or int8: the base quantized with bitsandbytes as transformers'
            BitsAndBytesConfig does (model/quantize.py); with `lora`, QLoRA.

    Returns:
        An `ActivationReport`.

    Raises:
        BudgetUnreachableError: no plan fits `budget`; it names the lowest peak reached.
        UsageError: the model cannot be built or stepped on these inputs, or the arguments are wrong.
        ActivationsError: anything else: memlayout's own failure, still one line.
    """
    try:
        optimizer = resolve_step(step, optimizer, budget)
        generation = check_generation(step, new_tokens, cache)
        adaptation = Adaptation(lora=LoraOptions(lora) if isinstance(lora, int) else lora, quantize=quantize)
        return _analyze(target, inputs, kwargs=kwargs, budget=budget, device=device, mode=mode, trust=trust,
                        optimizer=optimizer, autocast=autocast, dtype=dtype, main_module=main_module, gpu=gpu,
                        step_kind=step, model_class=model_class, generation=generation, adaptation=adaptation)
    except MemlayoutError:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ActivationsError(f"the analysis stopped: {type(exc).__name__}: {text} (at {where(exc)})") from exc


def _analyze(
    target: Any,
    inputs: InputsArg,
    *,
    kwargs: Mapping[str, Any] | None,
    budget: int | float | BudgetSpec | None,
    device: str,
    mode: str,
    trust: bool,
    optimizer: str,
    autocast: str | None = None,
    dtype: str | None = None,
    main_module: str | None = None,
    gpu: str | None = None,
    step_kind: str = "train",
    model_class: str | None = None,
    generation: Generation | None = None,
    adaptation: Adaptation | None = None,
) -> ActivationReport:
    step, notes, target_text, kind, chosen_by = prepare_step(
        target, inputs, kwargs=kwargs, device=device, mode=mode, trust=trust, optimizer=optimizer, autocast=autocast,
        dtype=dtype, main_module=main_module, gpu=gpu, step_kind=step_kind, model_class=model_class,
        generation=generation,
        adaptation=adaptation,
    )
    try:
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
    if step.fake_cuda is not None:
        notes.append(step.fake_cuda.note())
    summary = summarize(baseline, cuda=step.device.startswith("cuda"))
    if any(kind not in UNRANGED for _, kind, _ in baseline.assumptions):
        summary = _with_range(step, summary)
    modules = module_facts(baseline)
    resolved = step_budget(step, budget)
    plan = plan_for_budget(step, baseline, summary, modules, resolved) if resolved is not None else None
    predicted = None
    if step.mode == "real":
        # --real is a check of the prediction, so it makes the prediction too: the same
        # target and inputs, traced on fake tensors as a run without --real traces them.
        # A step that reads values fails on fake tensors (that is when --real is the hint):
        # the real report stands, and says there is no prediction to read it against.
        try:
            adaptation = adaptation or Adaptation()
            predicted = analyze(target, inputs, kwargs=kwargs, device=device, trust=trust, optimizer=optimizer,
                                autocast=autocast, dtype=dtype, main_module=main_module, gpu=gpu,
                                step=step_kind, model_class=model_class, lora=adaptation.lora,
                                new_tokens=generation.new_tokens if generation else None,
                                cache=generation.cache if generation else None,
                                quantize=adaptation.quantize).summary.peak_bytes
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
        optimizer_state_dtype=state_dtype(step.optimizer),
        predicted_peak_bytes=predicted,
        step=step_kind,
        cuda_capability=_cuda_capability(step),
        class_chosen_by=chosen_by,
        generation=summarize_generation(baseline, generation) if generation is not None else None,
        roofline=roofline_text(step),
        parameters=parameter_split(step.model),
        adapted=step.adapted,
    )


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


def prepare_step(
    target: Any,
    inputs: InputsArg,
    *,
    kwargs: Mapping[str, Any] | None,
    device: str,
    mode: str,
    trust: bool,
    optimizer: str,
    autocast: str | None = None,
    dtype: str | None = None,
    main_module: str | None = None,
    gpu: str | None = None,
    step_kind: str = "train",
    model_class: str | None = None,
    generation: Generation | None = None,
    adaptation: Adaptation | None = None,
) -> tuple[StepWorld, list[str], str | None, str, str]:
    """The model built in its tensor world, its inputs made, its optimizer's state given: ready to trace.

    Returns the step, the notes so far, the target as text (None for a live module), its kind, and why
    the model is of its class (`ActivationReport.class_chosen_by`).
    """
    import torch

    if device == "meta":
        mode = "meta" if mode != "real" else mode
    check_optimizer(optimizer)
    if autocast is not None and autocast not in ("bf16", "fp16"):
        raise UsageError(f"unknown --autocast {autocast!r}", "use bf16 or fp16")
    cast_to = torch_dtype(dtype) if dtype is not None else None
    device = device_for_gpu(device, mode, gpu)
    step = StepWorld(mode, device, gpu)
    if autocast is not None:
        step.autocast = Autocast("cuda" if device.startswith("cuda") else "cpu", autocast)
    notes: list[str] = []
    if isinstance(target, torch.nn.Module):
        step.model = step.adopt_model(target)
        target_text, kind, chosen_by = None, "module", LIVE_MODULE
    else:
        built = build_model(
            str(target), trust=trust, main_module=main_module, context=step.context, world=step.mode, device=step.device,
            adopt=step.adopt_model, model_class=model_class,
        )
        step.model = built.model
        notes.extend(built.notes)
        target_text, kind, chosen_by = str(target), built.kind.kind, built.class_chosen_by
    if generation is not None:
        check_can_generate(step.model)
        step.generate(generation)
        notes.append(generation.note())
    if step.device not in ("cpu", "meta"):
        if step.mode == "real":
            with step.context():
                step.model.to(step.device)
        else:
            notes.extend(place_fake_model(step.model, step.device, step.context))
    if cast_to is not None:
        cast_model(step.model, cast_to, step.mode, step.device, step.context)
    if adaptation is not None and not adaptation.empty:
        mover = TensorMover(step.mode, step.device, step.context)
        # The step's context: peft's `.to()` of each adapter is a conversion that changes nothing, which fake
        # parameters cannot swap outside it (trace/module_conversions.py).
        step.model, step.adapted = adapt_model(step.model, adaptation, world=step.mode, device=step.device,
                                               move=mover.move, context=step.step_context)
    step.model.train()
    if step_kind in ("inference", "generate"):
        step.model.eval()  # as serving code runs it: dropout off, norms on their running statistics
        step.inference = True
    step.initial_modules = frozenset((path, type(m).__name__) for path, m in step.model.named_modules())
    step.make_inputs(inputs, kwargs)
    if cast_to is not None:
        step.cast_inputs(cast_to)
    if not step.args and not step.kwargs:
        raise UsageError("no inputs to run the step with", _inputs_hint(step.model))
    try:
        step.add_optimizer(optimizer)
    except MemlayoutError:
        raise
    except Exception as exc:  # the model's own forward or backward failed on these inputs
        raise _step_failed(exc, step) from exc
    return step, notes, target_text, kind, chosen_by


def _inputs_hint(model: Any) -> str:
    """How to give inputs: read off a Hugging Face model's config where it has one, else the general form."""
    suggested = suggested_inputs(model)
    if suggested:
        flags = " ".join(f"--input '{spec.describe()}'" for spec in suggested)
        return f"e.g. {flags}, from {type(model).__name__}'s config; or --inputs pkg.mod:make_inputs"
    return ("give --input DTYPE[SHAPE] once per input, name=DTYPE[SHAPE] for a keyword input, e.g. "
            "'float32[8,3,224,224]' for images or 'int64[4,128]<50257' for token ids below 50257; "
            "or --inputs pkg.mod:make_inputs")


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
                          f"{_why_no_value(exc, step)}", "pass --real to run the step for real (it takes the memory)")
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


