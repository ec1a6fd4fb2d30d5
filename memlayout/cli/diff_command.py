"""`memlayout diff`: check flags, compare the two checkpoints, hand the diff to its formatter."""

from __future__ import annotations

from typing import Annotated

import typer

from memlayout.cli.errors import one_line_errors
from memlayout.cli.formats import (
    Command,
    OutputFormat,
    RenderOptions,
    supported,
    terminal_color,
    to_format,
)
from memlayout.cli.inspect_command import parse_ties
from memlayout.cli.options import (
    DebugOption,
    DiffFormatOption,
    FailOn,
    IgnoreOption,
    OutputOption,
    SelectOption,
    split_codes,
)
from memlayout.cli.progress import progress_callback
from memlayout.errors import UsageError
from memlayout.output.writer import write_output


def diff_command(
    a: Annotated[
        str, typer.Argument(help="The checkpoint before: file, model directory or pkg.module:callable.", metavar="A")
    ],
    b: Annotated[str, typer.Argument(help="The checkpoint after, in the same or any other format.", metavar="B")],
    output_format: DiffFormatOption = OutputFormat.TABLE,
    output: OutputOption = None,
    strip_prefix: Annotated[
        list[str] | None,
        typer.Option("--strip-prefix", help="Remove PREFIX from names on both sides (module., _orig_mod.); repeatable.",
                     metavar="PREFIX"),
    ] = None,
    rename: Annotated[
        list[str] | None,
        typer.Option("--map", help="Match A's names starting OLD to B's starting NEW; repeatable.", metavar="OLD=NEW"),
    ] = None,
    html: Annotated[
        str | None,
        typer.Option("--html", help="Also write A and B's storage maps side by side to FILE (self-contained HTML).",
                     metavar="FILE"),
    ] = None,
    deep: Annotated[bool, typer.Option("--deep", help="Read every value of both: report tensors whose values changed.")] = False,
    fail_on: Annotated[
        FailOn, typer.Option("--fail-on", help="Exit 1 when a change is at or above this severity.")
    ] = FailOn.WARNING,
    tie: Annotated[
        list[str] | None, typer.Option("--tie", help="Declare TARGET=SOURCE tied in B; repeatable.", metavar="A=B")
    ] = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    min_duplicate_bytes: Annotated[
        int, typer.Option("--min-duplicate-bytes", help="ML102 ignores smaller tensors.", min=0)
    ] = 4096,
    debug: DebugOption = False,
) -> None:
    """Compare checkpoint A with B: tensors added and removed, dtype/shape/stride/device changes, lost ties, bytes."""
    with one_line_errors(debug):
        from memlayout.diff import DiffOptions, run_diff
        from memlayout.diff.names import NameMap, parse_renames

        prefixes = tuple(strip_prefix or ())
        if any(not p for p in prefixes):
            raise UsageError("--strip-prefix needs a non-empty PREFIX", "e.g. --strip-prefix module.")
        options = DiffOptions(
            names=NameMap(prefixes, parse_renames(rename or ())),
            deep=deep,
            ties=parse_ties(tie),
            select=tuple(split_codes(select)),
            ignore=tuple(split_codes(ignore)),
            min_duplicate_bytes=min_duplicate_bytes,
        )
        with progress_callback(enabled=deep) as progress:
            diff = run_diff(a, b, options, progress=progress)
        render = RenderOptions(color=terminal_color(output_format, output))
        if html is not None:
            # The page first: an unwritable --html path fails before anything is printed.
            page = supported(to_format(OutputFormat.HTML).diff, OutputFormat.HTML, Command.DIFF)
            write_output(page(render).render_pieces(diff), html)
        formatter = supported(to_format(output_format).diff, output_format, Command.DIFF)(render)
        write_output(formatter.render_pieces(diff), output)
    if diff.fails(fail_on.value):
        raise typer.Exit(1)
