"""`memlayout inspect`: check flags, call the library, hand the report to a formatter."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memlayout.batch import BatchReport
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
from memlayout.errors import MemlayoutError, UsageError
from memlayout.report import OutputFormat


def parse_ties(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    ties = []
    for value in values or []:
        target, sep, source = value.partition("=")
        if not sep or not target.strip() or not source.strip():
            raise UsageError(f"--tie {value!r} is not of the form TARGET=SOURCE", "e.g. --tie lm_head.weight=embed.weight")
        ties.append((target.strip(), source.strip()))
    return tuple(ties)


class EveryPathFailed(MemlayoutError):
    """No path of the call could be inspected; exit 2 with nothing written."""


def report_load_errors(batch: BatchReport) -> None:
    """Put each path's load error on stderr, one line each, whatever the report's format.

    When no path loaded, nothing is written: the last path's error becomes the
    command's one-line error, exit 2.
    """
    failures = batch.failures
    last = len(failures) - 1 if len(failures) == len(batch.paths) else len(failures)
    for path in failures[:last]:
        print(f"memlayout: error: {path.error_line}", file=sys.stderr)
    if last < len(failures):
        only = len(batch.paths) == 1
        raise EveryPathFailed((failures[last].error or "") if only else failures[last].error_line)


def inspect_command(
    paths: Annotated[
        list[str],
        typer.Argument(help="Checkpoint files, model directories, folders of checkpoints, or pkg.module:callable.",
                       metavar="PATH..."),
    ],
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="The report's format.", case_sensitive=False)
    ] = OutputFormat.TABLE,
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
    all_storages: Annotated[
        bool, typer.Option("--all", help="The table lists every storage, not the 20 largest of more than 50.")
    ] = False,
    trust: Annotated[bool, typer.Option("--trust", hidden=True)] = False,
    debug: DebugOption = False,
) -> None:
    """Report non-contiguous, duplicated, aliased, bloated and misaligned weights, for one path or several."""
    with one_line_errors(debug):
        if trust:
            # inspect reads every format inertly, so there is nothing to allow. The
            # option is kept, hidden, only to say so: a user who passes it believes
            # inspect might run code, and deserves to learn it never does.
            raise UsageError(
                "inspect takes no --trust: it never runs code from the file, so there is nothing to allow",
                "drop --trust; only `memlayout flatten` of a pickled module needs it",
            )
        from memlayout.batch import inspect_paths
        from memlayout.report import reporter_for
        from memlayout.rules import RuleConfig

        config = RuleConfig(deep=deep, min_duplicate_bytes=min_duplicate_bytes, ties=parse_ties(tie))
        with progress_callback(enabled=deep) as progress:
            batch = inspect_paths(
                paths, config=config, select=split_codes(select), ignore=split_codes(ignore), fail_on=fail_on.value,
                progress=progress, debug=debug,
            )
        report_load_errors(batch)
        color = output is None and output_format is OutputFormat.TABLE and sys.stdout.isatty()
        reporter = reporter_for(output_format, color=color, all_storages=all_storages)
        write_output(reporter.render(batch), output)
    raise typer.Exit(batch.exit_code())
