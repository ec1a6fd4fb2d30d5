"""`StepRequest`: every setting of one prediction, in one frozen object, checked when it is made.

Each field is named as its long option is (`world_size` is `--world-size`, and
`world-size` in `[tool.memlayout.activations]`), so the command line, the config file
and a Python caller speak of a setting by one name, and an error names it that way
(`errors.SettingError`). Values are kept in one spelling (`bfloat16` becomes `bf16`, a
budget's text a `BudgetSpec`, a list a tuple), so that the command line and Python
build equal requests for the same settings.

What a request asks for is one of five pipelines (`Pipeline`): the weights alone, one
step on one device, each rank of a sharded step, the largest size that fits, or one
step at each size of a sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from memlayout.activations.request import rules
from memlayout.activations.request.vocabulary import (
    DEFAULT_OPTIMIZER,
    Pipeline,
    SweepSpec,
    fit_axis,
    precision,
    sweep_spec,
)
from memlayout.activations.sizes import BudgetSpec, parse_budget, parse_size
from memlayout.errors import SettingError, UsageError

GROUPS: dict[str, tuple[str, ...]] = {
    "Target": ("target", "model_class", "trust", "main_module", "timeout", "download"),
    "Inputs": ("input", "inputs", "kwargs"),
    "Step": ("step", "optimizer", "new_tokens", "cache", "weights"),
    "Device": ("device", "gpu", "gpu_memory", "real"),
    "Precision": ("dtype", "autocast"),
    "Budget and plans": ("budget", "allow_offload", "fit", "sweep"),
    "Ranks": ("world_size", "fsdp", "fsdp_modules", "no_reshard_after_forward", "param_dtype", "reduce_dtype",
              "tp", "ddp", "bucket_cap_mb", "gradient_as_bucket_view"),
    "Recipe": ("optimizer_impl", "clip_grad_norm", "clip_grad_impl", "selective_ac", "ac_modules",
               "reshard_after_forward", "eager"),
    "Adapters": ("lora", "lora_targets", "lora_dropout", "dora", "quantize"),
    "Output": ("format", "output", "depth", "plot", "snapshot"),
}
"""The settings by the part of a step they describe, in the order `memlayout activations --help` lists them."""
PYTHON_ONLY = ("target", "kwargs", "pipeline")
"""Fields that are no option of the command line: TARGET is its argument, and tensors are no text."""


class ModelTarget(NamedTuple):
    """The settings that say which model is built, and how (model/target.py, model/build.py)."""

    target: str
    trust: bool = False
    main_module: str | None = None
    model_class: str | None = None


@dataclass(frozen=True)
class StepRequest:
    """One prediction's settings, as `memlayout activations` takes them (each field is the option of its name).

    Example:
        >>> request = StepRequest("gpt2/", input=("int64[8,1024]<50257",), world_size=8, fsdp=True,
        ...                       dtype="bf16", budget="78GiB")  # doctest: +SKIP
        >>> memlayout.activations.pipelines(request)  # a RanksReport
    """

    # Target
    target: Any = None
    """An nn.Module (copied, never run), or a TARGET string: `pkg.mod:build`, a Hugging Face model directory or
    config.json (local, a URL or a Hub id), a pickled module (with `trust`), or a checkpoint (`weights`)."""
    model_class: str | None = None
    """The transformers class a config builds (`T5ForConditionalGeneration`, `AutoModelForSeq2SeqLM`); None: the
    config's architectures, else the model type's first head with a loss (model/hf_class.py)."""
    trust: bool = False
    """Allow unpickling a module file, which runs code from it."""
    main_module: str | None = None
    """With `trust`: the module that defines what a pickle saved from a script names `__main__.X`."""
    timeout: int = 30
    """Seconds a remote read may take, its redirects and retries included."""
    download: bool = False
    """Download a remote checkpoint whole where its server ignores HTTP Range requests."""
    # Inputs
    input: tuple[Any, ...] = ()
    """The positional inputs, each a spec (`"int64[4,128]<50257"`, `"labels=int64[4,128]<50257"`), an
    `InputSpec` or a tensor."""
    inputs: str | None = None
    """Instead of `input`: `pkg.mod:make_inputs`, returning a tuple or a dict."""
    kwargs: Mapping[str, Any] | None = field(default=None, compare=False)
    """Keyword inputs as tensors (Python only)."""
    # Step
    step: str = "train"
    """train (forward, loss, backward, the optimizer's step), inference (forward only, under
    `torch.inference_mode`) or generate (`model.generate`, `new_tokens` of them)."""
    optimizer: str | None = None
    """adamw (a training step's default), adam, sgd (momentum 0.9) or none."""
    new_tokens: int | None = None
    """With step generate: how many tokens to generate."""
    cache: str | None = None
    """With step generate: dynamic (the default) or static."""
    weights: bool = False
    """No step: the weights in each dtype and the fixed costs of training them."""
    # Device
    device: str = "cpu"
    """cpu, cuda, cuda:N or meta (shapes only)."""
    gpu: str | None = None
    """The GPU to trace for (a key of device/gpus.py); implies `device` cuda."""
    gpu_memory: int | None = None
    """The card's memory in bytes (an int or `"96GiB"`), for a card the GPU table lacks: `gpu`'s capability and
    rates (the default GPU's without it) with this memory; implies `device` cuda."""
    real: bool = False
    """Run the step for real on `device`, as a check (it takes the memory)."""
    # Precision
    dtype: str | None = None
    """bf16, fp16 or fp32 (or bfloat16, ...): cast the model's floating tensors and inputs first."""
    autocast: str | None = None
    """bf16 or fp16: forward and loss under `torch.autocast`."""
    # Budget and plans
    budget: BudgetSpec | None = None
    """What the step must fit in: bytes (an int or `"78GiB"`) or a share of the GPU's memory (a float in (0, 1],
    or `"90%"`)."""
    allow_offload: bool = False
    """Let a plan for ranks offload parameters, gradients and optimizer state to the CPU."""
    fit: str | None = None
    """batch, seq or seq:N: the largest batch (or sequence) whose step fits `budget`."""
    sweep: str | None = None
    """AXIS=SIZES (`batch=1,2,4,8`, `seq=512:4096:512`): the step at each size, and with `budget` the plan at each;
    with `fit` too, its answers."""
    # Ranks
    world_size: int | None = None
    """Predict each rank of this many."""
    fsdp: bool = False
    """Shard with FSDP2."""
    fsdp_modules: tuple[str, ...] = ()
    """The modules FSDP2 wraps (dotted paths with `*`, or class names); empty: the main blocks."""
    no_reshard_after_forward: bool = False
    """FSDP2's reshard_after_forward=False."""
    param_dtype: str | None = None
    """FSDP2 mixed precision: the dtype parameters are gathered in."""
    reduce_dtype: str | None = None
    """FSDP2 mixed precision: the dtype gradients are reduced in."""
    tp: int = 1
    """Tensor parallel over this many ranks."""
    ddp: bool = False
    """Replicate with DistributedDataParallel."""
    bucket_cap_mb: float | None = None
    """DDP's bucket_cap_mb."""
    gradient_as_bucket_view: bool = False
    """DDP's gradient_as_bucket_view."""
    # Recipe: what the training loop and its sharding code choose
    optimizer_impl: str | None = None
    """for-loop, foreach or fused: torch.optim's implementation; None: as torch picks it for the parameters (foreach
    for plain CUDA tensors, for-loop on the CPU and for the DTensors FSDP2 and tensor parallel make)."""
    clip_grad_norm: float | None = None
    """`torch.nn.utils.clip_grad_norm_` to this max norm after backward, before the optimizer's step."""
    clip_grad_impl: str | None = None
    """With `clip_grad_norm`: foreach or for-loop; None: as torch picks it (foreach for plain tensors on the CPU
    and CUDA, for-loop for DTensors)."""
    selective_ac: str | None = None
    """Op-level activation checkpointing (`create_selective_checkpoint_contexts`) of `ac_modules`: what to save, a
    comma list of matmuls, every-other-matmul, attention, collectives and max, or torchtitan; or any policy as
    `pkg.module:policy`."""
    ac_modules: tuple[str, ...] = ()
    """The modules whose forward runs under checkpoint (dotted paths with `*`, or class names): every op
    recomputed, or `selective_ac`'s; empty with `selective_ac`: the main blocks."""
    reshard_after_forward: tuple[str, ...] = ()
    """FSDP2's reshard_after_forward per wrapped module: a preset (torchtitan, lightning) or PATTERN=true|false
    entries, the last that matches a module deciding; unnamed modules reshard (FSDP2's default)."""
    eager: bool = False
    """A model compiled with torch.compile: trace its eager step (model/compiled.py); without it, it is refused."""
    # Adapters
    lora: int | None = None
    """peft's LoRA adapters of this rank."""
    lora_targets: tuple[str, ...] | None = None
    """The modules to adapt (or all-linear); given as text, split at commas."""
    lora_dropout: float | None = None
    """The adapters' dropout."""
    dora: bool = False
    """DoRA (peft's use_dora)."""
    quantize: str | None = None
    """nf4, fp4 or int8: the base quantized with bitsandbytes."""
    # Output
    format: str = "table"
    """The report's format (the command line's `--format`)."""
    output: str | None = None
    """Write the report to this file instead of stdout."""
    depth: int = 3
    """The module depth the table shows."""
    plot: str | None = None
    """With `sweep`: draw its curve into this file (.svg, .png or .html)."""
    snapshot: str | None = None
    """Write the predicted step as a memory snapshot (`torch.cuda.memory._snapshot()`'s pickle) to this file."""
    pipeline: Pipeline | None = None
    """What is asked; None: read off the settings (`Pipeline`). `analyze`, `fit` and the others name theirs."""

    def __post_init__(self) -> None:
        self._normalize()
        if self.pipeline is None:
            object.__setattr__(self, "pipeline", self._pipeline())
        rules.check(self)

    def _normalize(self) -> None:
        """Each value in its one spelling: tuples for lists, a BudgetSpec for a budget, bf16 for bfloat16."""
        values: dict[str, Any] = {
            "input": (self.input,) if isinstance(self.input, str) else tuple(self.input or ()),
            "fsdp_modules": (self.fsdp_modules,) if isinstance(self.fsdp_modules, str) else tuple(self.fsdp_modules or ()),
            "ac_modules": _texts(self.ac_modules), "reshard_after_forward": _texts(self.reshard_after_forward),
            "gpu_memory": _gpu_memory(self.gpu_memory),
            "dtype": precision(self.dtype), "autocast": precision(self.autocast),
            "param_dtype": precision(self.param_dtype), "reduce_dtype": precision(self.reduce_dtype),
            "budget": _budget(self.budget), "format": str(getattr(self.format, "value", self.format)),
        }
        if isinstance(self.lora_targets, str):
            values["lora_targets"] = tuple(name.strip() for name in self.lora_targets.split(",") if name.strip())
        elif self.lora_targets is not None:
            values["lora_targets"] = tuple(self.lora_targets)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _pipeline(self) -> Pipeline:
        if self.weights or rules.first_given(self, rules.STEP_SETTINGS) is None:
            return Pipeline.WEIGHTS
        if self.sweep is not None:
            return Pipeline.SWEEP
        if self.fit is not None:
            return Pipeline.FIT
        return Pipeline.STEP if self.world_size is None else Pipeline.RANKS

    # What the settings mean, read where the parts below need them -----------------------------------------------
    @property
    def mode(self) -> str:
        """The tensors the step runs on: real (`real`), meta (`device` meta) or fake."""
        return "real" if self.real else "meta" if self.device == "meta" else "fake"

    @property
    def step_optimizer(self) -> str:
        """The optimizer the step runs: `optimizer`, else adamw for a training step and none for a forward."""
        if self.step != "train":
            return "none"
        return DEFAULT_OPTIMIZER if self.optimizer is None else self.optimizer

    @property
    def step_inputs(self) -> Any:
        """The inputs as the step makes them: `inputs`'s spec, else the list of `input`."""
        return self.inputs if self.inputs else list(self.input)

    @property
    def model_target(self) -> ModelTarget:
        return ModelTarget(str(self.target), self.trust, self.main_module, self.model_class)

    @property
    def fit_axis(self) -> tuple[str, int | None]:
        """(batch or seq, the dimension seq:N names or None)."""
        return fit_axis(self.fit or "batch")

    @property
    def sweep_spec(self) -> SweepSpec:
        """The sweep's axis and sizes (`sweep` given)."""
        assert self.sweep is not None
        return sweep_spec(self.sweep)

    @property
    def serving(self) -> bool:
        """Ranks that serve (step inference or generate, one tensor-parallel group) rather than train."""
        return self.world_size is not None and self.step != "train" and self.fit is None


def _texts(value: Any) -> tuple[str, ...]:
    """A list setting as a tuple: one text is one item."""
    return (value,) if isinstance(value, str) else tuple(value or ())


def _gpu_memory(value: Any) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    try:
        return parse_size(str(value))
    except UsageError:
        raise SettingError(f"`gpu_memory` {value!r} is not a size", "e.g. `gpu_memory=96GiB`") from None


def _budget(value: Any) -> BudgetSpec | None:
    if value is None or isinstance(value, BudgetSpec):
        return value
    if isinstance(value, bool):
        raise SettingError(f"`budget` {value!r} is not a size or a share of the GPU's memory")
    if isinstance(value, int):
        return BudgetSpec(bytes=value)
    if isinstance(value, float):
        return BudgetSpec(fraction=value)
    return parse_budget(str(value))


SETTINGS = tuple(f.name for f in fields(StepRequest) if f.name not in PYTHON_ONLY)
"""The settings a command line or a config file gives, in the order of the fields."""
