"""`memlayout activations`: trace one training step, report its activation memory, plan to a budget."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memlayout import _torch
from memlayout.activations.budget import parse_budget
from memlayout.activations.step.generate import CACHE_HELP, NEW_TOKENS_HELP, check_generation
from memlayout.activations.step.optimizer import DEFAULT_OPTIMIZER
from memlayout.activations.step.optimizer import HELP as OPTIMIZER_HELP
from memlayout.activations.step.run import STEP_HELP
from memlayout.cli.formats import (
    Command,
    OutputFormat,
    RenderOptions,
    supported,
    terminal_color,
    to_format,
)
from memlayout.cli.options import (
    ActivationsFormatOption,
    DebugOption,
    DownloadOption,
    MainModuleOption,
    OutputOption,
    TimeoutOption,
    TrustOption,
    device_option,
    mebibytes,
    probability,
    remote_reading,
)
from memlayout.errors import (
    BudgetUnreachableError,
    NothingFitsError,
    RanksBudgetUnreachableError,
    UsageError,
)
from memlayout.output.writer import write_output

if TYPE_CHECKING:
    from memlayout.activations.budget import BudgetSpec
    from memlayout.activations.model.adapt import Adaptation
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.activations.step.generate import Generation
    from memlayout.load.remote_location import RemoteOptions

BUDGET_UNREACHABLE = 1
ADAPTER_FLAGS = ("--lora", "--lora-targets", "--lora-dropout", "--dora", "--quantize")
CUDA_WHEELS = "https://download.pytorch.org/whl/cu130"
"""The index of torch's CUDA wheels, as memlayout/activations/trace/world.py's refusal names it (a test holds the
two equal): --gpu's help cannot import that module, which loads the tracer, on every start."""


def activations_command(
    target: Annotated[
        str, typer.Argument(
            help="pkg.module:build, a Hugging Face model directory or config.json, or a pickled module. The config "
            "may be remote: an https:// URL, hf://ORG/NAME@REVISION (the revision optional), or a bare Hub id when no local path of that "
            "name exists (only config.json is fetched)."
        )
    ],
    inputs: Annotated[
        str | None, typer.Option("--inputs", help="pkg.module:make_inputs returning a tuple or a dict.", metavar="SPEC")
    ] = None,
    input_specs: Annotated[
        list[str] | None,
        typer.Option("--input", help="One input: 'float32[8,3,224,224]', 'int64[4,128]<50257', name=... for a keyword; repeatable.",
                     metavar="SPEC"),
    ] = None,
    budget: Annotated[
        str | None, typer.Option("--budget", help="Plan checkpoints so the step fits (with --world-size, each rank's "
                                 "peak; resharding and offload too): bytes (8GiB, 512MiB), or a share of the GPU's "
                                 "memory as torch reports it (0.9, 90%; with --gpu or --device cuda). For a GPU the "
                                 "caching allocator's reserved peak plus the CUDA context and workspaces must fit; "
                                 "on the CPU the peak of live tensors.", metavar="SIZE|SHARE")
    ] = None,
    output_format: ActivationsFormatOption = OutputFormat.TABLE,
    output: OutputOption = None,
    device: Annotated[
        str, device_option("cpu", "cuda", "cuda:N", "meta", help="The device the step is for (meta: shapes only).")
    ] = "cpu",
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="Trace for this GPU (implies --device cuda): its capability decides the attention "
                     "kernel, as torch decides it. No GPU is needed here, but torch's CUDA build is (a CPU build "
                     f"refuses it): pip install torch --index-url {CUDA_WHEELS} (on Linux, plain pip install torch "
                     "is one). h100, h100-pcie, h200, b200, a100-80gb, a100-40gb, l40s, l4, a10g, 4090, 3090, t4, "
                     "v100.", metavar="NAME"),
    ] = None,
    real: Annotated[bool, typer.Option("--real", help="Run the step for real on --device (uses the memory), as a check.")] = False,
    depth: Annotated[int, typer.Option("--depth", help="Module depth the table shows.", min=0)] = 3,
    optimizer: Annotated[
        str | None, typer.Option("--optimizer", help=OPTIMIZER_HELP, metavar="adamw|adam|sgd|none")
    ] = None,
    step: Annotated[str, typer.Option("--step", help=STEP_HELP, metavar="train|inference|generate")] = "train",
    new_tokens: Annotated[
        int | None, typer.Option("--new-tokens", help=NEW_TOKENS_HELP, metavar="N")
    ] = None,
    cache: Annotated[str | None, typer.Option("--cache", help=CACHE_HELP, metavar="dynamic|static")] = None,
    fit_axis: Annotated[
        str | None,
        typer.Option("--fit", help="Find the largest batch (batch), or the longest sequence (seq), whose peak fits "
                     "--budget, on fake traces, with no checkpointing and with the budget search's plan: batch "
                     "scales dim 0 of every --input; seq dim 1 of every integer --input with two or more dims "
                     "(token ids, labels, masks), or seq:N dim N of every --input that has it.",
                     metavar="batch|seq|seq:N"),
    ] = None,
    autocast: Annotated[
        str | None,
        typer.Option("--autocast", help="Run forward and loss under torch.autocast in this dtype, with --device's "
                     "own op lists (CPU's differ from CUDA's); backward follows the dtypes forward chose.",
                     metavar="bf16|fp16"),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help="Cast the model's floating parameters and buffers to this dtype first, as "
                     "pure low-precision training does, and floating inputs with them; the optimizer's state follows it.", metavar="bf16|fp16|fp32"),
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", help="Predict each rank of N (with --fsdp or --ddp) in this process, on fake "
                     "tensors under a fake process group; the inputs are one rank's batch.", min=1, metavar="N"),
    ] = None,
    fsdp: Annotated[
        bool, typer.Option("--fsdp", help="Shard with FSDP2: fully_shard on each block of the model's main "
                           "nn.ModuleList, then on the root.")
    ] = False,
    fsdp_modules: Annotated[
        list[str] | None,
        typer.Option("--fsdp-modules", help="Wrap these modules instead of the blocks: a dotted path where * is one "
                     "name (model.layers.*), or a class name; repeatable.", metavar="PATTERN"),
    ] = None,
    no_reshard_after_forward: Annotated[
        bool, typer.Option("--no-reshard-after-forward", help="Keep each block's gathered parameters from forward to "
                           "backward (fully_shard's reshard_after_forward=False).")
    ] = False,
    param_dtype: Annotated[
        str | None, typer.Option("--param-dtype", help="FSDP2 mixed precision: the dtype parameters are gathered "
                                 "and computed in (bfloat16, float16, float32).", metavar="DTYPE")
    ] = None,
    reduce_dtype: Annotated[
        str | None, typer.Option("--reduce-dtype", help="FSDP2 mixed precision: the dtype gradients are reduced in.",
                                 metavar="DTYPE")
    ] = None,
    tp: Annotated[
        int, typer.Option("--tp", help="Tensor parallel over K of the ranks, inside FSDP2: attention and MLP "
                          "projections split column-wise and row-wise. With --step inference or generate and --world-size "
                          "K, the ranks of a tensor-parallel group serving the model (torch 2.14 or later).",
                          min=1, metavar="K")
    ] = 1,
    ddp: Annotated[
        bool, typer.Option("--ddp", help="Replicate with DistributedDataParallel: every rank holds the whole model, "
                           "its gradients and DDP's gradient buckets (the bucket layout is reported).")
    ] = False,
    bucket_cap_mb: Annotated[
        float | None, typer.Option("--bucket-cap-mb", parser=mebibytes, help="DDP's bucket_cap_mb: the size gradient buckets close "
                                   "at, in MiB (DDP's default: 25, the first bucket 1).", metavar="MIB")
    ] = None,
    gradient_as_bucket_view: Annotated[
        bool, typer.Option("--gradient-as-bucket-view", help="DDP's gradient_as_bucket_view: each .grad is a view "
                           "of its bucket instead of a copy beside it (DDP's default: off).")
    ] = False,
    allow_offload: Annotated[
        bool, typer.Option("--allow-offload", help="Let a --budget plan offload parameters, gradients and optimizer "
                           "state to the CPU (FSDP2's CPUOffloadPolicy).")
    ] = False,
    weights: Annotated[
        bool,
        typer.Option("--weights", help="Without tracing a step: the weights in each dtype (float32, float16/bf16, "
                     "int8, int4) and the fixed costs of training them with --optimizer (weights, gradients, "
                     "optimizer state), exact from the model built on the meta device or from a checkpoint's headers "
                     "(safetensors, .bin, sharded, local or remote). What a run without --input prints."),
    ] = False,
    model_class: Annotated[
        str | None,
        typer.Option("--model-class", help="The transformers class a config builds (T5ForConditionalGeneration, or "
                     "AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModel, ...). Without it: the config's "
                     "architectures, else the model type's first head with a loss (sequence-to-sequence first for "
                     "an encoder-decoder), else the base model.", metavar="NAME"),
    ] = None,
    lora: Annotated[
        int | None, typer.Option("--lora", help="Add peft's LoRA adapters of this rank before tracing: only they "
                                 "train, and the optimizer keeps state for them only. Every other setting is "
                                 "peft's LoraConfig default, its target modules for the model type included. "
                                 "Needs the lora extra.", min=1, metavar="R")
    ] = None,
    lora_targets: Annotated[
        str | None, typer.Option("--lora-targets", help="The modules to adapt, by name (q_proj,v_proj), or "
                                 "all-linear; instead of peft's default for the model type.", metavar="A,B,...")
    ] = None,
    lora_dropout: Annotated[
        float | None, typer.Option("--lora-dropout", help="The adapters' dropout, instead of peft's default (0.0).",
                                   metavar="P", parser=probability)
    ] = None,
    dora: Annotated[bool, typer.Option("--dora", help="DoRA: LoRA with a learned magnitude per output (peft's "
                                       "use_dora); the rank is --lora's, or peft's default.")] = False,
    quantize: Annotated[
        str | None, typer.Option("--quantize", help="Build the base with bitsandbytes' 4-bit (nf4, fp4) or 8-bit "
                                 "(int8) layers, as transformers' BitsAndBytesConfig does; with --lora, QLoRA. "
                                 "Needs a transformers model and the lora extra.", metavar="nf4|fp4|int8")
    ] = None,
    timeout: TimeoutOption = 30,
    download: DownloadOption = False,
    trust: TrustOption = False,
    main_module: MainModuleOption = None,
    debug: DebugOption = False,
) -> int:
    """Activation memory of one training step, and a checkpoint plan that fits --budget.

    With --world-size N --fsdp, each rank's peak under FSDP2 (and --tp), and a plan that fits the largest rank;
    with --step inference (or generate) --world-size K --tp K, each rank of a tensor-parallel group serving the model;
    with --world-size N --ddp, each rank's peak under DistributedDataParallel, with its gradient buckets.
    Without --input (or with --weights), no step: the weights in each dtype and the fixed costs of training them.
    """
    _torch.require("memlayout activations")
    # transformers logs config remarks while building a model from its config; they are
    # not about memory, and stdout/stderr belong to the report and its one-line errors.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from memlayout.activations.analysis import analyze

    if inputs and input_specs:
        raise UsageError("give --inputs or --input, not both")
    step_flags = {"--input": bool(input_specs), "--inputs": bool(inputs), "--budget": budget is not None,
                  "--fit": fit_axis is not None, "--world-size": world_size is not None, "--real": real,
                  "--step": step != "train", "--autocast": autocast is not None, "--dtype": dtype is not None,
                  "--device": device != "cpu", "--gpu": gpu is not None, "--lora": lora is not None,
                  "--lora-targets": lora_targets is not None, "--lora-dropout": lora_dropout is not None,
                  "--dora": dora, "--quantize": quantize is not None}
    if weights or not any(step_flags.values()):
        given = next((flag for flag, value in step_flags.items() if value), None)
        if given in ADAPTER_FLAGS:
            # The fixed costs --weights gives are a full fine-tune's: every parameter trains.
            raise UsageError(f"--weights counts every parameter as trainable, and {given} adapts the model",
                             f"give --input to trace the step with {given}: its report splits trainable and frozen")
        if given is not None:
            raise UsageError(f"--weights answers without tracing a step, and {given} is for a step",
                             f"drop --weights to trace the step, or drop {given}")
        _sharding_options(  # a rank flag without --world-size is refused here too
            world_size, fsdp=fsdp, fsdp_modules=fsdp_modules, no_reshard_after_forward=no_reshard_after_forward,
            param_dtype=param_dtype, reduce_dtype=reduce_dtype, tp=tp, allow_offload=allow_offload,
        )
        return _weights_only(target, optimizer=optimizer, trust=trust, main_module=main_module, model_class=model_class,
                             remote=remote_reading([target], timeout, download), output_format=output_format,
                             output=output)
    budget_spec = parse_budget(budget) if budget is not None else None
    if fit_axis is not None and allow_offload:
        raise UsageError("--fit does not search offload plans yet", "leave --allow-offload out")
    sharding = _sharding_options(
        world_size, fsdp=fsdp, fsdp_modules=fsdp_modules, no_reshard_after_forward=no_reshard_after_forward,
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, tp=tp, allow_offload=allow_offload, ddp=ddp,
        bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view,
    )
    if sharding is not None and step != "train" and fit_axis is None:
        sharding = replace(sharding, serving=step)  # tensor-parallel serving (ranks/serving_step.py)
    generation = check_generation(step, new_tokens, cache)
    adaptation = _adaptation(lora, lora_targets, lora_dropout, dora, quantize)
    if adaptation is not None and sharding is not None:
        raise UsageError(f"{'--quantize' if quantize else '--lora'} is not traced with --world-size yet",
                         "predict one device without --world-size")
    # Before --fit, which would otherwise search the ranks with no word of the card.
    if gpu is not None and sharding is not None:
        raise UsageError("--gpu is not traced with --world-size yet",
                         "drop --gpu; --ddp's ranks are traced for the CPU (the same buckets)" if sharding.ddp else
                         "drop --gpu; --device cuda traces ranks")
    if fit_axis is not None:
        return _fit(target, inputs, input_specs, fit_axis, budget_spec, device=device, gpu=gpu, real=real, step=step,
                    optimizer=optimizer, autocast=autocast, dtype=dtype, sharding=sharding, trust=trust,
                    main_module=main_module, output_format=output_format, output=output, depth=depth,
                    model_class=model_class, adaptation=adaptation, generation=generation)
    if sharding is not None:
        from memlayout.activations.ranks import analyze_ranks

        if budget_spec is not None and budget_spec.bytes is None:
            raise UsageError("--budget with --world-size is each rank's peak, as a size",
                             "give it in bytes, e.g. --budget 78GiB")
        if real or device == "meta":
            raise UsageError(
                f"--world-size predicts ranks on fake tensors; {'--real' if real else '--device meta'} does not apply",
                "measure real ranks under torchrun (the CPU allocator's events, torch.profiler), and predict for "
                "--device cpu" if sharding.ddp is not None or sharding.serving is not None else
                "measure real ranks under torchrun (FSDPMemTracker), and predict for --device cpu or cuda",
            )
        try:
            ranks = analyze_ranks(
                target, inputs if inputs else list(input_specs or []), sharding=sharding,
                optimizer=optimizer or DEFAULT_OPTIMIZER, budget=budget_spec.bytes if budget_spec else None,
                allow_offload=allow_offload,
                device=device, trust=trust, main_module=main_module, autocast=autocast, dtype=dtype,
                model_class=model_class, generation=generation,
            )
        except RanksBudgetUnreachableError as exc:
            print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
            return BUDGET_UNREACHABLE
        return _write_report(ranks, output_format, output, depth)
    try:
        report = analyze(
            target, inputs if inputs else list(input_specs or []), budget=budget_spec, device=device,
            mode="real" if real else ("meta" if device == "meta" else "fake"), trust=trust, optimizer=optimizer,
            autocast=autocast, dtype=dtype, main_module=main_module, gpu=gpu, step=step, model_class=model_class,
            new_tokens=new_tokens, cache=cache, **_adaptation_arguments(adaptation),
        )
    except BudgetUnreachableError as exc:
        print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
        return BUDGET_UNREACHABLE
    return _write_report(report, output_format, output, depth)


def _weights_only(
    target: str, *, optimizer: str | None, trust: bool, main_module: str | None, model_class: str | None,
    remote: "RemoteOptions", output_format: OutputFormat, output: str | None,
) -> int:
    """`--weights`, or no inputs: the weights in each dtype and the fixed costs of training, no step traced."""
    from memlayout.activations.weights import weights_report

    report = weights_report(target, optimizer=optimizer or DEFAULT_OPTIMIZER, trust=trust, main_module=main_module,
                            model_class=model_class, remote=remote)
    return _write_report(report, output_format, output, 0)


def _fit(
    target: str, inputs: str | None, input_specs: list[str] | None, fit_axis: str, budget: "BudgetSpec | None", *,
    device: str, gpu: str | None, real: bool, step: str, optimizer: str | None, autocast: str | None, dtype: str | None,
    sharding: "ShardingOptions | None", trust: bool, main_module: str | None, model_class: str | None,
    output_format: OutputFormat,
    output: str | None, depth: int, adaptation: "Adaptation | None" = None, generation: "Generation | None" = None,
) -> int:
    """`--fit`: the largest batch (or sequence) that fits, rendered as the command's other reports are."""
    from memlayout.activations.fit.size_search import fit, parse_axis

    axis, seq_dim = parse_axis(fit_axis)
    if real:
        raise UsageError("--fit searches on fake traces; --real does not apply",
                         "check its answer with --real at the batch it reports")
    if inputs:
        raise UsageError("--fit scales the inputs' sizes, so it needs them as --input specs, not --inputs",
                         "give each input as --input DTYPE[SHAPE], e.g. --input 'int64[1,4096]<32000'")
    try:
        report = fit(
            target, list(input_specs or []), axis=axis, seq_dim=seq_dim, budget=budget, device=device, gpu=gpu,
            step=step, optimizer=optimizer, autocast=autocast, dtype=dtype, sharding=sharding, trust=trust,
            main_module=main_module, model_class=model_class, generation=generation,
            **_adaptation_arguments(adaptation),
        )
    except NothingFitsError as exc:
        print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
        return BUDGET_UNREACHABLE
    return _write_report(report, output_format, output, depth)


def _adaptation(lora: int | None, targets: str | None, dropout: float | None, dora: bool,
                quantize: str | None) -> "Adaptation | None":
    """--quantize, --lora and the flags that shape its adapters, as one Adaptation; None without either.

    A LoRA flag without --lora (or --dora) is refused rather than ignored.
    """
    from memlayout.activations.model.adapt import Adaptation
    from memlayout.activations.model.adapters import LoraOptions

    if lora is None and not dora:
        given = [flag for flag, value in (("--lora-targets", targets), ("--lora-dropout", dropout)) if value is not None]
        if given:
            raise UsageError(f"{given[0]} shapes LoRA adapters, and --lora R asks for them", "e.g. --lora 16")
        return Adaptation(quantize=quantize) if quantize is not None else None
    names = tuple(name.strip() for name in targets.split(",") if name.strip()) if targets is not None else None
    if names is not None and not names:
        raise UsageError("--lora-targets names no module", "e.g. --lora-targets q_proj,v_proj, or all-linear")
    return Adaptation(lora=LoraOptions(rank=lora, targets=names, dropout=dropout, dora=dora), quantize=quantize)


def _adaptation_arguments(adaptation: "Adaptation | None") -> dict[str, Any]:
    """analyze's and fit's `lora` and `quantize` keywords."""
    if adaptation is None:
        return {}
    return {"lora": adaptation.lora, "quantize": adaptation.quantize}


def _sharding_options(
    world_size: int | None, *, fsdp: bool, fsdp_modules: list[str] | None, no_reshard_after_forward: bool,
    param_dtype: str | None, reduce_dtype: str | None, tp: int, allow_offload: bool, ddp: bool = False,
    bucket_cap_mb: float | None = None, gradient_as_bucket_view: bool = False,
) -> "ShardingOptions | None":
    """--world-size and the flags that shape its ranks, as one ShardingOptions; None without --world-size.

    A rank flag without --world-size is refused rather than ignored: the user asked for ranks; so is a flag
    of FSDP2's with --ddp, and a flag of DDP's without it.
    """
    ddp_flags = {"--bucket-cap-mb": bucket_cap_mb is not None, "--gradient-as-bucket-view": gradient_as_bucket_view}
    fsdp_flags = {"--fsdp-modules": fsdp_modules, "--no-reshard-after-forward": no_reshard_after_forward,
                  "--param-dtype": param_dtype, "--reduce-dtype": reduce_dtype, "--allow-offload": allow_offload}
    if world_size is None:
        rank_flags = {"--fsdp": fsdp, **fsdp_flags, "--tp": tp != 1, "--ddp": ddp, **ddp_flags}
        given = [flag for flag, value in rank_flags.items() if value]
        if given:
            example = "--ddp" if given[0] in ("--ddp", *ddp_flags) else "--fsdp"
            raise UsageError(f"{given[0]} needs --world-size N", f"e.g. --world-size 8 {example}")
        return None
    from memlayout.activations.ranks.ddp import DdpOptions
    from memlayout.activations.ranks.parallel import ShardingOptions

    given = [flag for flag, value in (fsdp_flags if ddp else ddp_flags).items() if value]
    if given and (ddp or fsdp):  # neither: ShardingOptions.check says what --world-size needs
        raise UsageError(f"{given[0]} is {'FSDP2' if ddp else 'DDP'}'s, and the ranks are "
                         f"{'DistributedDataParallel' if ddp else 'FSDP2'}'s",
                         f"leave {given[0]} out, or give {'--fsdp' if ddp else '--ddp'} instead")
    return ShardingOptions(
        world_size=world_size, fsdp=fsdp, fsdp_modules=tuple(fsdp_modules or ()),
        reshard_after_forward=not no_reshard_after_forward, param_dtype=param_dtype, reduce_dtype=reduce_dtype, tp=tp,
        ddp=DdpOptions(bucket_cap_mb, gradient_as_bucket_view) if ddp else None,
    )


def _write_report(report: Any, output_format: OutputFormat, output: str | None, depth: int) -> int:
    """Render any activations report (one device, ranks, --fit) in --format and write it to --output."""
    render = RenderOptions(color=terminal_color(output_format, output), depth=depth)
    formatter = supported(to_format(output_format).activations, output_format, Command.ACTIVATIONS)(render)
    write_output(formatter.render_pieces(report), output)
    return 0
