"""`memlayout activations`: trace one training step, report its activation memory, plan to a budget."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from memlayout import _torch
from memlayout.activations.optimizer import DEFAULT_OPTIMIZER
from memlayout.activations.optimizer import HELP as OPTIMIZER_HELP
from memlayout.cli.errors import one_line_errors
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
    OutputOption,
    TrustOption,
    device_option,
)
from memlayout.errors import UsageError
from memlayout.output.writer import write_output

BUDGET_UNREACHABLE = 1


def activations_command(
    target: Annotated[
        str, typer.Argument(help="pkg.module:build, a Hugging Face model directory or config.json, or a pickled module.")
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
        str | None, typer.Option("--budget", help="Plan checkpoints so the peak fits: bytes, 8GiB, 512MiB.", metavar="SIZE")
    ] = None,
    output_format: ActivationsFormatOption = OutputFormat.TABLE,
    output: OutputOption = None,
    device: Annotated[
        str, device_option("cpu", "cuda", "cuda:N", "meta", help="The device the step is for (meta: shapes only).")
    ] = "cpu",
    real: Annotated[bool, typer.Option("--real", help="Run the step for real on --device (uses the memory), as a check.")] = False,
    depth: Annotated[int, typer.Option("--depth", help="Module depth the table shows.", min=0)] = 3,
    optimizer: Annotated[str, typer.Option("--optimizer", help=OPTIMIZER_HELP, metavar="adamw|adam|sgd|none")] = DEFAULT_OPTIMIZER,
    trust: TrustOption = False,
    debug: DebugOption = False,
) -> None:
    """Activation memory of one training step, and a checkpoint plan that fits --budget."""
    with one_line_errors(debug):
        _torch.require("memlayout activations")
        # transformers logs config remarks while building a model from its config; they are
        # not about memory, and stdout/stderr belong to the report and its one-line errors.
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from memlayout.activations.analysis import BudgetUnreachableError, analyze
        from memlayout.activations.sizes import parse_size

        if inputs and input_specs:
            raise UsageError("give --inputs or --input, not both")
        budget_bytes = parse_size(budget) if budget is not None else None
        try:
            report = analyze(
                target, inputs if inputs else list(input_specs or []), budget=budget_bytes, device=device,
                mode="real" if real else ("meta" if device == "meta" else "fake"), trust=trust, optimizer=optimizer,
            )
        except BudgetUnreachableError as exc:
            print(f"memlayout: error: {exc.one_line()}", file=sys.stderr)
            raise typer.Exit(BUDGET_UNREACHABLE) from None
        render = RenderOptions(color=terminal_color(output_format, output), depth=depth)
        formatter = supported(to_format(output_format).activations, output_format, Command.ACTIVATIONS)(render)
        write_output(formatter.render_pieces(report), output)
