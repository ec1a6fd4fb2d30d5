"""`memlayout activations`' options: one per setting of the step request, each in its group of `--help`.

Each option is named as its setting (`--world-size` is `StepRequest.world_size`), so the
command needs no table of its own between the two: `activations_command` hands the values
it is given to `StepRequest` by name, and an error the library raises about a setting
(`world_size`) is shown here as the flag (`--world-size`: `flag`). The groups are the
request's (`GROUPS`), shown by `--help` in that order (`rich_help_panel`).
"""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import inspect
from typing import Annotated, Any, NamedTuple

import typer

from memlayout.activations.device.gpus import GPUS
from memlayout.activations.request.config_file import resolve_config
from memlayout.activations.request.step_request import GROUPS, SETTINGS
from memlayout.activations.step.generate import CACHE_HELP, NEW_TOKENS_HELP
from memlayout.activations.step.optimizer import HELP as OPTIMIZER_HELP
from memlayout.activations.step.run import STEP_HELP
from memlayout.cli.formats import Command, OutputFormat
from memlayout.cli.options import device_option, format_option, mebibytes, number, probability
from memlayout.errors import MemlayoutError

CONFIGURATION = "Configuration"
"""The group of the options that say where settings come from, and how errors show."""
PANEL = {name: group for group, names in GROUPS.items() for name in names}
DTYPE_METAVAR = "bf16|fp16|fp32"
"""Every dtype option's spelling; torch's names (bfloat16, float16, float32) are accepted too."""


class Row(NamedTuple):
    """One parameter of the command: its name, the type typer parses into, its default, and typer's declaration."""

    name: str
    annotation: Any
    default: Any
    declaration: Any


def _option(name: str, annotation: Any, default: Any, *decls: str, **info: Any) -> Row:
    """An option in its setting's group; `decls` default to the setting's own flag."""
    flags = decls or (f"--{name.replace('_', '-')}",)
    panel = PANEL.get(name, CONFIGURATION)
    return Row(name, annotation, default, typer.Option(*flags, rich_help_panel=panel, **info))


def _in_panel(info: Any, panel: str) -> Any:
    """A shared option's declaration (cli/options.py), shown in `panel`."""
    info.rich_help_panel = panel
    return info


def _dtype_help(what: str) -> str:
    return f"{what} ({DTYPE_METAVAR}, or torch's bfloat16, float16, float32)."


ROWS: tuple[Row, ...] = (
    # Target
    Row("target", str, inspect.Parameter.empty, typer.Argument(
        help="pkg.module:build, a Hugging Face model directory or config.json, or a pickled module. The config may be "
        "remote: an https:// URL, hf://ORG/NAME@REVISION (the revision optional), or a bare Hub id when no local "
        "path of that name exists (only config.json is fetched).", rich_help_panel="Target")),
    _option("model_class", str | None, None, help="The transformers class a config builds (T5ForConditionalGeneration, "
            "or AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModel, ...). Without it: the config's architectures, "
            "else the model type's first head with a loss (sequence-to-sequence first for an encoder-decoder), else "
            "the base model.", metavar="NAME"),
    _option("trust", bool, False, help="Allow real unpickling, which runs code from the file. Only for files you "
                                       "trust."),
    _option("main_module", str | None, None, help="With --trust: the module (on PYTHONPATH) that defines the classes a "
            "model saved from a script pickles as __main__.Name.", metavar="MODULE"),
    _option("timeout", int, 30, help="For URLs and Hub models: give up on a request, its redirects and retries "
            "included, after SECONDS.", min=1, metavar="SECONDS"),
    _option("download", bool, False, help="For URLs whose server ignores HTTP Range requests: download the whole file "
            "instead of refusing."),
    # Inputs
    _option("input", list[str] | None, None, help="One input: 'float32[8,3,224,224]', 'int64[4,128]<50257', name=... "
            "for a keyword; repeatable.", metavar="SPEC"),
    _option("inputs", str | None, None, help="pkg.module:make_inputs returning a tuple or a dict.", metavar="SPEC"),
    # Step
    _option("step", str, "train", help=STEP_HELP, metavar="train|inference|generate"),
    _option("optimizer", str | None, None, help=OPTIMIZER_HELP, metavar="adamw|adam|sgd|none"),
    _option("new_tokens", int | None, None, help=NEW_TOKENS_HELP, metavar="N"),
    _option("cache", str | None, None, help=CACHE_HELP, metavar="dynamic|static"),
    _option("weights", bool, False, help="Without tracing a step: the weights in each dtype (float32, float16/bf16, "
            "int8, int4) and the fixed costs of training them with --optimizer (weights, gradients, optimizer state), "
            "exact from the model built on the meta device or from a checkpoint's headers (safetensors, .bin, "
            "sharded, local or remote). What a run without --input prints."),
    # Device
    Row("device", str, "cpu", _in_panel(device_option("cpu", "cuda", "cuda:N", "meta", help="The device the step is "
        "for (meta: shapes only)."), "Device")),
    _option("gpu", str | None, None, help="Trace for this GPU (implies --device cuda): its capability decides the "
            "attention kernel, as torch decides it. Neither a GPU nor torch's CUDA build is needed: the CPU wheel "
            f"and macOS give the CUDA build's figures. {', '.join(spec.key for spec in GPUS)}.", metavar="NAME"),
    _option("gpu_memory", str | None, None, help="The card's memory, for a card the table lacks (96GiB, 94GB): "
            "--gpu's capability and rates (the h100's without --gpu) with this memory; implies --device cuda.",
            metavar="SIZE"),
    _option("real", bool, False, help="Run the step for real on --device (uses the memory), as a check."),
    # Precision
    _option("dtype", str | None, None, help=_dtype_help("Cast the model's floating parameters and buffers to this "
            "dtype first, as pure low-precision training does, and floating inputs with them; the optimizer's state "
            "follows it"), metavar=DTYPE_METAVAR),
    _option("autocast", str | None, None, help="Run forward and loss under torch.autocast in this dtype, with "
            "--device's own op lists (CPU's differ from CUDA's); backward follows the dtypes forward chose (bf16 or "
            "fp16, or bfloat16, float16).", metavar="bf16|fp16"),
    # Budget and plans
    _option("budget", str | None, None, help="Plan checkpoints so the step fits (with --world-size, each rank's peak; "
            "resharding and offload too): bytes (8GiB, 512MiB), or a share of the GPU's memory as torch reports it "
            "(0.9, 90%; with --gpu or --device cuda). For a GPU the caching allocator's reserved peak plus the CUDA "
            "context and workspaces must fit; on the CPU the peak of live tensors.", metavar="SIZE|SHARE"),
    _option("allow_offload", bool, False, help="Let a --budget plan offload parameters, gradients and optimizer state "
            "to the CPU (FSDP2's CPUOffloadPolicy)."),
    _option("fit", str | None, None, help="Find the largest batch (batch), or the longest sequence (seq), whose peak "
            "fits --budget, on fake traces, with no checkpointing and with the budget search's plan: batch scales "
            "dim 0 of every --input; seq dim 1 of every integer --input with two or more dims (token ids, labels, "
            "masks), or seq:N dim N of every --input that has it.", metavar="batch|seq|seq:N"),
    _option("sweep", str | None, None, help="Predict the step at each size of the batch (batch=1,2,4,8) or the "
            "sequence (seq=512:4096:512, STOP included; seq:N for dim N), scaled as --fit scales it: one row per "
            "size with the peak, and on a GPU the reserved peak and the figure compared with the card; with "
            "--budget, whether each fits and the plan at each; with --fit, its answers. The step is traced at a few "
            "of the sizes and the others evaluated from those traces where their allocations agree (the report says "
            "which).",
            metavar="AXIS=SIZES"),
    # Ranks
    _option("world_size", int | None, None, help="Predict each rank of N (with --fsdp or --ddp) in this process, on "
            "fake tensors under a fake process group; the inputs are one rank's batch.", min=1, metavar="N"),
    _option("fsdp", bool, False, help="Shard with FSDP2: fully_shard on each block of the model's main nn.ModuleList, "
            "then on the root."),
    _option("fsdp_modules", list[str] | None, None, help="Wrap these modules instead of the blocks: a dotted path "
            "where * is one name (model.layers.*), or a class name; repeatable.", metavar="PATTERN"),
    _option("no_reshard_after_forward", bool, False, help="Keep each block's gathered parameters from forward to "
            "backward (fully_shard's reshard_after_forward=False)."),
    _option("param_dtype", str | None, None, help=_dtype_help("FSDP2 mixed precision: the dtype parameters are "
            "gathered and computed in"), metavar=DTYPE_METAVAR),
    _option("reduce_dtype", str | None, None, help=_dtype_help("FSDP2 mixed precision: the dtype gradients are "
            "reduced in"), metavar=DTYPE_METAVAR),
    _option("tp", int, 1, help="Tensor parallel over K of the ranks, inside FSDP2: attention and MLP projections split "
            "column-wise and row-wise. With --step inference or generate and --world-size K, the ranks of a "
            "tensor-parallel group serving the model (torch 2.14 or later).", min=1, metavar="K"),
    _option("ddp", bool, False, help="Replicate with DistributedDataParallel: every rank holds the whole model, its "
            "gradients and DDP's gradient buckets (the bucket layout is reported)."),
    _option("bucket_cap_mb", float | None, None, parser=mebibytes, help="DDP's bucket_cap_mb: the size gradient "
            "buckets close at, in MiB (DDP's default: 25, the first bucket 1).", metavar="MIB"),
    _option("gradient_as_bucket_view", bool, False, help="DDP's gradient_as_bucket_view: each .grad is a view of its "
            "bucket instead of a copy beside it (DDP's default: off)."),
    # Recipe: what the training loop and its sharding code choose
    _option("optimizer_impl", str | None, None, help="torch.optim's implementation: for-loop (one tensor at a "
            "time), foreach (every tensor at once: temporaries the size of the parameters) or fused. Default: as "
            "torch picks it for the parameters, foreach for plain CUDA tensors, for-loop on the CPU and for the "
            "DTensors FSDP2 and --tp make.", metavar="for-loop|foreach|fused"),
    _option("clip_grad_norm", float | None, None, parser=number, help="torch.nn.utils.clip_grad_norm_ to this max "
            "norm after backward, before the optimizer's step, as most training loops do.", metavar="MAX"),
    _option("clip_grad_impl", str | None, None, help="With --clip-grad-norm: foreach or for-loop (clip_grad_norm_'s "
            "foreach). Default: as torch picks it, foreach for plain tensors, for-loop for DTensors.",
            metavar="foreach|for-loop"),
    _option("selective_ac", str | None, None, help="Op-level activation checkpointing of --ac-modules "
            "(torch.utils.checkpoint's create_selective_checkpoint_contexts): what to save, a comma list of matmuls, "
            "every-other-matmul, attention (each device's attention kernels), collectives and max, or torchtitan "
            "(its save list); or any policy as pkg.module:policy, called as torch calls a policy (ctx, op, *args, "
            "**kwargs).", metavar="SAVES|pkg.module:policy"),
    _option("ac_modules", list[str] | None, None, help="Checkpoint these modules' forwards (every op recomputed in "
            "backward, or --selective-ac's): a dotted path where * is one name, or a class name; repeatable. "
            "Default with --selective-ac: the blocks of the model's main nn.ModuleList.", metavar="PATTERN"),
    _option("reshard_after_forward", list[str] | None, None, help="FSDP2's reshard_after_forward per wrapped "
            "module: torchtitan (every block but the last), lightning (every module), or PATTERN=true|false "
            "(a module path with *, or a class name; a bare true|false is every module); repeatable, the last "
            "that names a module decides.", metavar="PRESET|PATTERN=BOOL"),
    _option("eager", bool, False, help="For a model compiled with torch.compile: trace its eager step, each compiled "
            "module's uncompiled one. Without it such a model is refused: a compiled step saves and fuses otherwise "
            "(AOTAutograd's partitioner, Inductor), and memlayout traces eager steps."),
    # Adapters
    _option("lora", int | None, None, help="Add peft's LoRA adapters of this rank before tracing: only they train, "
            "and the optimizer keeps state for them only. Every other setting is peft's LoraConfig default, its "
            "target modules for the model type included. Needs the lora extra.", min=1, metavar="R"),
    _option("lora_targets", str | None, None, help="The modules to adapt, by name (q_proj,v_proj), or all-linear; "
            "instead of peft's default for the model type.", metavar="A,B,..."),
    _option("lora_dropout", float | None, None, parser=probability, help="The adapters' dropout, instead of peft's "
            "default (0.0).", metavar="P"),
    _option("dora", bool, False, help="DoRA: LoRA with a learned magnitude per output (peft's use_dora); the rank is "
            "--lora's, or peft's default."),
    _option("quantize", str | None, None, help="Build the base with bitsandbytes' 4-bit (nf4, fp4) or 8-bit (int8) "
            "layers, as transformers' BitsAndBytesConfig does; with --lora, QLoRA. Needs a transformers model and "
            "the lora extra.", metavar="nf4|fp4|int8"),
    # Output
    Row("format", OutputFormat, OutputFormat.TABLE, _in_panel(format_option(Command.ACTIVATIONS), "Output")),
    _option("output", str | None, None, "--output", "-o", help="Write the report to FILE instead of stdout.",
            metavar="FILE"),
    _option("depth", int, 3, help="Module depth the table shows.", min=0),
    _option("plot", str | None, None, help="With --sweep: draw the peak and the reserved peak against the size, the "
            "card's memory and --budget as lines, and --fit's answers marked, into FILE (.svg or .png with "
            "matplotlib, .html with plotly; the plot extra).", metavar="FILE"),
    _option("snapshot", str | None, None, help="Write the predicted step as a memory snapshot in the format "
            "torch.cuda.memory._snapshot() writes (a pickle: segments, and alloc, free and segment events whose frames "
            "name the module and the phase), for PyTorch's memory viewer and python -m torch.cuda._memory_viz.",
            metavar="FILE"),
    # Configuration: the command line's own
    _option("isolated", bool, False, help="Read no configuration file.", is_eager=True),
    _option("config", str | None, None, help="Read settings from FILE instead of the nearest pyproject.toml's "
            "[tool.memlayout.activations] (keys: the long options, in kebab-case; a flag replaces the file's "
            "value).", metavar="FILE", is_eager=True, callback=lambda ctx, value: read_config(ctx, value)),
    _option("debug", bool, False, help="Show the full traceback on errors."),
)
"""Every parameter of the command, in the order of the request's fields, then the command line's own."""
COMMAND_LINE_ONLY = ("isolated", "config", "debug")


def signature(rows: tuple[Row, ...] = ROWS) -> inspect.Signature:
    """The signature typer reads the command's parameters from: `ctx` first, then one per row."""
    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    parameters.extend(inspect.Parameter(row.name, inspect.Parameter.KEYWORD_ONLY, default=row.default,
                                        annotation=Annotated[row.annotation, row.declaration]) for row in rows)
    return inspect.Signature(parameters, return_annotation=int)


CONFIG_ERROR = "memlayout.activations.config_error"
"""Where `read_config` keeps the file's error for the command to raise (`ctx.meta`)."""


def read_config(ctx: typer.Context, value: str | None) -> str | None:
    """`--config`'s callback, run before the other options are read (it is eager): the file's settings become the
    options' defaults (`default_map`), so that each is read as its flag is, and a flag given replaces it.

    A file that cannot be read, or has a key that is unknown or a value of the wrong type, is the command's
    first error (`ctx.meta[CONFIG_ERROR]`): raised there, it is one line, or with --debug its traceback.
    """
    if ctx.resilient_parsing:
        return value
    try:
        settings = resolve_config(value, bool(ctx.params.get("isolated")))
    except MemlayoutError as exc:
        ctx.meta[CONFIG_ERROR] = exc
        return value
    text = {row.name for row in ROWS if row.annotation in (str, str | None)}
    defaults = {name: ",".join(given) if name in text and isinstance(given, list) else given
                for name, given in settings.items()}
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def flag(name: str) -> str | None:
    """The command line's spelling of a setting: `world_size` -> `--world-size`, `target` -> `TARGET`; None for a
    name that is no setting."""
    if name == "target":
        return "TARGET"
    return f"--{name.replace('_', '-')}" if name in SETTINGS else None

