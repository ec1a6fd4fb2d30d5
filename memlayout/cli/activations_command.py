"""`memlayout activations`: trace one training step, report its activation memory, plan to a budget."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memlayout import _torch
from memlayout.activations.sizes import parse_size
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
    MainModuleOption,
    OutputOption,
    TrustOption,
    device_option,
)
from memlayout.errors import (
    BudgetUnreachableError,
    NothingFitsError,
    RanksBudgetUnreachableError,
    UsageError,
)
from memlayout.output.writer import write_output

if TYPE_CHECKING:
    from memlayout.activations.ranks.parallel import ShardingOptions
    from memlayout.activations.step.generate import Generation

BUDGET_UNREACHABLE = 1


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
        str | None, typer.Option("--budget", help="Plan checkpoints so the peak fits (with --world-size, each rank's; "
                                      "resharding and offload too): bytes, 8GiB, 512MiB.", metavar="SIZE")
    ] = None,
    output_format: ActivationsFormatOption = OutputFormat.TABLE,
    output: OutputOption = None,
    device: Annotated[
        str, device_option("cpu", "cuda", "cuda:N", "meta", help="The device the step is for (meta: shapes only).")
    ] = "cpu",
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="Trace for this GPU (implies --device cuda): its capability decides the attention "
                     "kernel, as torch decides it; no GPU is needed here. h100, h100-pcie, h200, b200, a100-80gb, "
                     "a100-40gb, l40s, l4, a10g, 4090, 3090, t4, v100.", metavar="NAME"),
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
        typer.Option("--world-size", help="Predict each rank of N (with --fsdp) in this process, on fake tensors under "
                     "a fake process group; the inputs are one rank's batch.", min=1, metavar="N"),
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
                          "projections split column-wise and row-wise.", min=1, metavar="K")
    ] = 1,
    allow_offload: Annotated[
        bool, typer.Option("--allow-offload", help="Let a --budget plan offload parameters, gradients and optimizer "
                           "state to the CPU (FSDP2's CPUOffloadPolicy).")
    ] = False,
    trust: TrustOption = False,
    main_module: MainModuleOption = None,
    debug: DebugOption = False,
) -> int:
    """Activation memory of one training step, and a checkpoint plan that fits --budget.

    With --world-size N --fsdp, each rank's peak under FSDP2 (and --tp), and a plan that fits the largest rank.
    """
    _torch.require("memlayout activations")
    # transformers logs config remarks while building a model from its config; they are
    # not about memory, and stdout/stderr belong to the report and its one-line errors.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from memlayout.activations.analysis import analyze

    if inputs and input_specs:
        raise UsageError("give --inputs or --input, not both")
    budget_bytes = parse_size(budget) if budget is not None else None
    if fit_axis is not None and allow_offload:
        raise UsageError("--fit does not search offload plans yet", "leave --allow-offload out")
    sharding = _sharding_options(
        world_size, fsdp=fsdp, fsdp_modules=fsdp_modules, no_reshard_after_forward=no_reshard_after_forward,
        param_dtype=param_dtype, reduce_dtype=reduce_dtype, tp=tp, allow_offload=allow_offload,
    )
    generation = check_generation(step, new_tokens, cache)
    if fit_axis is not None:
        return _fit(target, inputs, input_specs, fit_axis, budget_bytes, device=device, gpu=gpu, real=real, step=step,
                    optimizer=optimizer, autocast=autocast, dtype=dtype, sharding=sharding, trust=trust,
                    main_module=main_module, output_format=output_format, output=output, depth=depth,
                    generation=generation)
    if gpu is not None and sharding is not None:
        raise UsageError("--gpu is not traced with --world-size yet", "drop --gpu; --device cuda traces ranks")
    if sharding is not None:
        from memlayout.activations.ranks import analyze_ranks

        if step != "train":
            raise UsageError(f"--step {step} is not traced with --world-size yet",
                             "predict one device's forward without --world-size")
        if real or device == "meta":
            raise UsageError(
                f"--world-size predicts ranks on fake tensors; {'--real' if real else '--device meta'} does not apply",
                "measure real ranks under torchrun (FSDPMemTracker), and predict for --device cpu or cuda",
            )
        try:
            ranks = analyze_ranks(
                target, inputs if inputs else list(input_specs or []), sharding=sharding,
                optimizer=optimizer or DEFAULT_OPTIMIZER, budget=budget_bytes, allow_offload=allow_offload,
                device=device, trust=trust, main_module=main_module, autocast=autocast, dtype=dtype,
            )
        except RanksBudgetUnreachableError as exc:
            print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
            return BUDGET_UNREACHABLE
        return _write_report(ranks, output_format, output, depth)
    try:
        report = analyze(
            target, inputs if inputs else list(input_specs or []), budget=budget_bytes, device=device,
            mode="real" if real else ("meta" if device == "meta" else "fake"), trust=trust, optimizer=optimizer,
            autocast=autocast, dtype=dtype, main_module=main_module, gpu=gpu, step=step, new_tokens=new_tokens,
            cache=cache,
        )
    except BudgetUnreachableError as exc:
        print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
        return BUDGET_UNREACHABLE
    return _write_report(report, output_format, output, depth)


def _fit(
    target: str, inputs: str | None, input_specs: list[str] | None, fit_axis: str, budget_bytes: int | None, *,
    device: str, gpu: str | None, real: bool, step: str, optimizer: str | None, autocast: str | None, dtype: str | None,
    sharding: "ShardingOptions | None", trust: bool, main_module: str | None, output_format: OutputFormat,
    output: str | None, depth: int, generation: "Generation | None" = None,
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
            target, list(input_specs or []), axis=axis, seq_dim=seq_dim, budget=budget_bytes, device=device, gpu=gpu,
            step=step, optimizer=optimizer, autocast=autocast, dtype=dtype, sharding=sharding, trust=trust,
            main_module=main_module, generation=generation,
        )
    except NothingFitsError as exc:
        print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
        return BUDGET_UNREACHABLE
    return _write_report(report, output_format, output, depth)


def _sharding_options(
    world_size: int | None, *, fsdp: bool, fsdp_modules: list[str] | None, no_reshard_after_forward: bool,
    param_dtype: str | None, reduce_dtype: str | None, tp: int, allow_offload: bool,
) -> "ShardingOptions | None":
    """--world-size and the flags that shape its ranks, as one ShardingOptions; None without --world-size.

    A rank flag without --world-size is refused rather than ignored: the user asked for ranks.
    """
    if world_size is None:
        rank_flags = {"--fsdp": fsdp, "--fsdp-modules": fsdp_modules, "--no-reshard-after-forward":
                      no_reshard_after_forward, "--param-dtype": param_dtype, "--reduce-dtype": reduce_dtype,
                      "--tp": tp != 1, "--allow-offload": allow_offload}
        given = [flag for flag, value in rank_flags.items() if value]
        if given:
            raise UsageError(f"{given[0]} needs --world-size N", "e.g. --world-size 8 --fsdp")
        return None
    from memlayout.activations.ranks.parallel import ShardingOptions

    return ShardingOptions(
        world_size=world_size, fsdp=fsdp, fsdp_modules=tuple(fsdp_modules or ()),
        reshard_after_forward=not no_reshard_after_forward, param_dtype=param_dtype, reduce_dtype=reduce_dtype, tp=tp,
    )


def _write_report(report: Any, output_format: OutputFormat, output: str | None, depth: int) -> int:
    """Render any activations report (one device, ranks, --fit) in --format and write it to --output."""
    render = RenderOptions(color=terminal_color(output_format, output), depth=depth)
    formatter = supported(to_format(output_format).activations, output_format, Command.ACTIVATIONS)(render)
    write_output(formatter.render_pieces(report), output)
    return 0
