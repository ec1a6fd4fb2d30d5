"""`memlayout diff`: check flags, compare the two checkpoints, hand the diff to its formatter."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import sys
from typing import Annotated

import typer

from memlayout.cli.formats import (
    Command,
    OutputFormat,
    RenderOptions,
    terminal_color,
    write_reports,
)
from memlayout.cli.options import (
    ConfigOption,
    DebugOption,
    DiffDeepOption,
    DiffFailOnOption,
    DiffFormatOption,
    DiffTieOption,
    DownloadOption,
    HtmlOption,
    IgnoreOption,
    IsolatedOption,
    MinDuplicateBytesOption,
    OutputOption,
    SelectOption,
    TimeoutOption,
    remote_reading,
    settings_with_flags,
)
from memlayout.cli.progress import progress_callback
from memlayout.errors import UsageError


def diff_command(
    a: Annotated[
        str, typer.Argument(
            help="The checkpoint before: file, model directory, pkg.module:callable, an https:// URL, "
            "hf://ORG/NAME@REVISION/PATH (the revision and path optional), or a bare Hub id when no local path of that "
            "name exists.",
            metavar="A",
        )
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
    html: HtmlOption = None,
    deep: DiffDeepOption = False,
    fail_on: DiffFailOnOption = None,
    tie: DiffTieOption = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    min_duplicate_bytes: MinDuplicateBytesOption = None,
    config: ConfigOption = None,
    isolated: IsolatedOption = False,
    timeout: TimeoutOption = 30,
    download: DownloadOption = False,
    debug: DebugOption = False,
) -> int:
    """Compare checkpoint A with B: tensors added and removed, dtype/shape/stride/device changes, lost ties, bytes."""
    from memlayout.diff import DiffOptions, run_diff
    from memlayout.diff.names import NameMap, parse_renames

    remote = remote_reading([a, b], timeout, download)
    prefixes = tuple(strip_prefix or ())
    if any(not p for p in prefixes):
        raise UsageError("--strip-prefix needs a non-empty PREFIX", "e.g. --strip-prefix module.")
    # The project's [tool.memlayout] settings, as inspect reads them; each flag given replaces its value.
    settings = settings_with_flags(
        config, isolated, select=select, ignore=ignore, fail_on=fail_on, tie=tie,
        min_duplicate_bytes=min_duplicate_bytes,
    )
    options = DiffOptions(names=NameMap(prefixes, parse_renames(rename or ())), deep=deep, select=settings.select,
                          ignore=settings.ignore, rules=settings.rule_config(deep),
                          per_tensor_ignores=settings.per_tensor_ignores, remote=remote)
    with progress_callback(enabled=deep) as progress:
        diff = run_diff(a, b, options, progress=progress)
    render = RenderOptions(color=terminal_color(output_format, output))
    write_reports(Command.DIFF, diff, render, output_format, output, html)
    if diff.name_hint is not None:
        # A hint, not data: stderr, so that --format json stays one document.
        print(f"memlayout: hint: {diff.name_hint}", file=sys.stderr)
    return 1 if diff.fails(settings.fail_on) else 0
