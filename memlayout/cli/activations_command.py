"""`memlayout activations`: what a step costs in memory, what fits, and the plan that makes it fit.

One command, its options in groups (`--help`), asking one of four questions: the weights
alone (`--weights`, or no step setting), one step on one device, each rank of a sharded
step (`--world-size`), or the largest size that fits (`--fit`). Subcommands were weighed
(`activations weights`, `activations fit`, ...): a positional TARGET before them cannot
be told from a subcommand's name, and the question is read off the settings as it always
was, so every command line written for the one command keeps working.

The command is thin: its options (activations_options.py) are the settings of
`StepRequest`, read also from `[tool.memlayout.activations]`; the request checks them,
`predict` answers it, and the report's formatter writes it. The library names settings
as Python does (`world_size`); an error reaches the user with its flags (`--world-size`).
"""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from memlayout import _torch
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.cli.activations_options import COMMAND_LINE_ONLY, CONFIG_ERROR, flag, signature
from memlayout.cli.formats import (
    Command,
    OutputFormat,
    RenderOptions,
    supported,
    terminal_color,
    to_format,
)
from memlayout.cli.options import remote_reading
from memlayout.errors import MemlayoutError, UsageError
from memlayout.output.writer import write_binary, write_output

if TYPE_CHECKING:
    from memlayout.activations.pipelines import Prediction


def activations_command(ctx: typer.Context, **values: Any) -> int:
    """Activation memory of one training step, and a checkpoint plan that fits --budget.

    With --world-size N --fsdp, each rank's peak under FSDP2 (and --tp), and a plan that fits the largest rank;
    with --step inference (or generate) --world-size K --tp K, each rank of a tensor-parallel group serving the model;
    with --world-size N --ddp, each rank's peak under DistributedDataParallel, with its gradient buckets.
    Without --input (or with --weights), no step: the weights in each dtype and the fixed costs of training them.
    Settings may also come from [tool.memlayout.activations] in pyproject.toml (--config).
    """
    config_error = ctx.meta.get(CONFIG_ERROR)
    if config_error is not None:
        raise config_error
    _torch.require("memlayout activations")
    # transformers logs config remarks while building a model from its config; they are
    # not about memory, and stdout/stderr belong to the report and its one-line errors.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with settings_as_flags():
        if values["config"] is not None and values["isolated"]:
            raise UsageError("--config and --isolated contradict each other", "pass one of them")
        request = request_from_command_line(values)
        return _write_report(_predicted(request), request)


activations_command.__signature__ = signature()  # type: ignore[attr-defined]


def request_from_command_line(values: dict[str, Any]) -> StepRequest:
    """The request the command's values make (flags over the config file's, already merged by click)."""
    return StepRequest(**{name: value for name, value in values.items() if name not in COMMAND_LINE_ONLY})


@contextmanager
def settings_as_flags() -> Iterator[None]:
    """An error that names settings the library's way (`world_size`) names them as flags here (`--world-size`)."""
    try:
        yield
    except MemlayoutError as exc:
        exc.respell(flag)
        raise


def _predicted(request: StepRequest) -> "Prediction":
    from memlayout.activations.pipelines import predict

    if request.plot is not None:  # a missing library is said before the trace, not after it
        from memlayout.activations.report.plot import require_library

        require_library(request.plot)

    if request.pipeline is Pipeline.WEIGHTS:  # a remote checkpoint's transport starts importing now
        remote_reading([str(request.target)], request.timeout, request.download)
    return predict(request)


def _write_report(report: "Prediction", request: StepRequest) -> int:
    """Render any activations report (the weights, one device, ranks, --fit) in --format and write it to --output."""
    output_format = OutputFormat(request.format)
    depth = 0 if request.pipeline is Pipeline.WEIGHTS else request.depth
    render = RenderOptions(color=terminal_color(output_format, request.output), depth=depth)
    formatter = supported(to_format(output_format).activations, output_format, Command.ACTIVATIONS)(render)
    write_output(formatter.render_pieces(report), request.output)
    _write_files(report, request)
    return 0


def _write_files(report: "Prediction", request: StepRequest) -> None:
    """--plot's picture of a sweep and --snapshot's pickle of one step, each written atomically."""
    from memlayout.activations.analysis import ActivationReport
    from memlayout.activations.fit.sweep import SweepReport

    if request.plot is not None and isinstance(report, SweepReport):
        from memlayout.activations.report.plot import render_plot

        write_binary(render_plot(report, os.path.splitext(request.plot)[1]), request.plot)
    if request.snapshot is not None and isinstance(report, ActivationReport):
        from memlayout.activations.report.snapshot import snapshot_bytes

        write_binary(snapshot_bytes(report), request.snapshot)
