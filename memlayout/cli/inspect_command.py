"""`memlayout inspect`: check flags, call the library, hand the report to a formatter."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memlayout.cli.errors import one_line_errors
from memlayout.cli.options import (
    DebugOption,
    FailOn,
    FailOnOption,
    IgnoreOption,
    OutputOption,
    SelectOption,
    split_codes,
)
from memlayout.cli.output import progress_callback, write_output
from memlayout.errors import UsageError


def parse_ties(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    ties = []
    for value in values or []:
        target, sep, source = value.partition("=")
        if not sep or not target.strip() or not source.strip():
            raise UsageError(f"--tie {value!r} is not of the form TARGET=SOURCE", "e.g. --tie lm_head.weight=embed.weight")
        ties.append((target.strip(), source.strip()))
    return tuple(ties)


def inspect_command(
    path: Annotated[str, typer.Argument(help="Checkpoint file, model directory, or pkg.module:callable.")],
    output_format: Annotated[
        str, typer.Option("--format", "-f", help="table (default) or json.", metavar="FORMAT")
    ] = "table",
    output: OutputOption = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    fail_on: FailOnOption = FailOn.WARNING,
    deep: Annotated[bool, typer.Option("--deep", help="Read every value: NaN/Inf (ML503), full duplicate scan.")] = False,
    tie: Annotated[
        list[str] | None, typer.Option("--tie", help="Declare TARGET=SOURCE tied (ML103); repeatable.", metavar="A=B")
    ] = None,
    min_duplicate_bytes: Annotated[
        int, typer.Option("--min-duplicate-bytes", help="ML102 ignores smaller tensors.", min=0)
    ] = 4096,
    trust: Annotated[bool, typer.Option("--trust", hidden=True)] = False,
    debug: DebugOption = False,
) -> None:
    """Report non-contiguous, duplicated, aliased, bloated and misaligned weights."""
    with one_line_errors(debug):
        if trust:
            # inspect reads every format inertly, so there is nothing to allow. The
            # option is kept, hidden, only to say so: a user who passes it believes
            # inspect might run code, and deserves to learn it never does.
            raise UsageError(
                "inspect takes no --trust: it never runs code from the file, so there is nothing to allow",
                "drop --trust; only `memlayout flatten` of a pickled module needs it",
            )
        from memlayout.inspection import run_inspection
        from memlayout.report import OutputFormat, render
        from memlayout.rules import RuleConfig

        try:
            fmt = OutputFormat(output_format)
        except ValueError:
            raise UsageError(f"unknown --format {output_format!r}", "use table or json") from None
        config = RuleConfig(deep=deep, min_duplicate_bytes=min_duplicate_bytes, ties=parse_ties(tie))
        with progress_callback(enabled=deep) as progress:
            report = run_inspection(
                path, config=config, select=split_codes(select), ignore=split_codes(ignore), progress=progress,
            )
        color = output is None and fmt is OutputFormat.TABLE and sys.stdout.isatty()
        write_output(render(report, fmt, color=color), output)
    if report.fails(fail_on.value):
        raise typer.Exit(1)
