"""`memlayout inspect`: check flags, call the library, hand the report to its formatter."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from memlayout.cli.errors import USAGE_OR_LOAD_ERROR, exit_code
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
    DownloadOption,
    HtmlOption,
    IgnoreOption,
    InspectDeepOption,
    InspectFailOnOption,
    InspectFormatOption,
    InspectTieOption,
    IsolatedOption,
    JobsOption,
    MinDuplicateBytesOption,
    OutputOption,
    PathsFromOption,
    SelectOption,
    ShardOption,
    TimeoutOption,
    remote_reading,
    settings_with_flags,
)
from memlayout.cli.progress import paths_progress, progress_callback
from memlayout.errors import UsageError

if TYPE_CHECKING:
    from memlayout.pipeline.batch import BatchReport
    from memlayout.pipeline.ranks import RankExchange


def ranks_agree_on_the_exit(ranks: "RankExchange", run: Callable[[], int], debug: bool) -> int:
    """Under torchrun: only rank 0 prints, and every rank exits with rank 0's status once rank 0 is done."""
    with ranks.quiet():
        code = exit_code(run, debug)
    return ranks.agree(code)


def report_load_errors(batch: "BatchReport") -> bool:
    """Put each path's load error on stderr, one line each, whatever the report's format.

    Returns whether no path loaded: then nothing is to be written, and the command exits 2.
    """
    failures = batch.failures
    last = len(failures) - 1 if len(failures) == len(batch.paths) else len(failures)
    for path in failures[:last]:
        print(f"memlayout: error: {path.error_line}", file=sys.stderr)
    if last == len(failures):
        return False
    # One path: its loader's message alone, as any other error of the command would read.
    only = len(batch.paths) == 1
    print(f"memlayout: error: {(failures[last].error or '') if only else failures[last].error_line}", file=sys.stderr)
    return True


def paths_to_inspect(paths: list[str] | None, paths_from: str | None, shard: str | None) -> list[str]:
    """The paths of the command line, then those --paths-from lists, less those --shard leaves to other machines.

    Raises:
        UsageError: no path at all, an unreadable --paths-from file, or a --shard that is not K/N.
    """
    from memlayout.pipeline.many_paths import parse_shard, read_path_list, take_shard

    targets = list(paths or [])
    if paths_from is not None:
        targets += read_path_list(paths_from)
    if not targets:
        where = f"--paths-from {paths_from} lists none" if paths_from is not None else "none was given"
        raise UsageError(f"no path to inspect: {where}", "give PATH..., or --paths-from FILE (one path a line)")
    return take_shard(targets, parse_shard(shard) if shard is not None else None)


def refuse_with_streaming(*, html: str | None, baseline: str | None, write_baseline: str | None) -> None:
    """--format jsonl writes each path as it finishes; what needs every path at once is refused, with the way out."""
    for flag, value in (("--html", html), ("--baseline", baseline), ("--write-baseline", write_baseline)):
        if value is not None:
            raise UsageError(
                f"--format jsonl writes each path as it finishes, and {flag} needs the whole run at once",
                f"use --format json with {flag}, or run {flag} separately",
            )


def inspect_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Checkpoint files, model directories, folders of checkpoints, pkg.module:callable, https:// "
            "(or s3://, gs://) URLs, hf://ORG/NAME@REVISION/PATH (the revision and path optional), or a bare Hub id "
            "(ORG/NAME) when no local path of that name exists: a local path always wins. A URL ending in /, "
            "config.json or .index.json is a model folder.",
            metavar="PATH...",
            show_default=False,
        ),
    ] = None,
    output_format: InspectFormatOption = OutputFormat.TABLE,
    output: OutputOption = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    fail_on: InspectFailOnOption = None,
    deep: InspectDeepOption = False,
    tie: InspectTieOption = None,
    min_duplicate_bytes: MinDuplicateBytesOption = None,
    min_bloat_bytes: Annotated[
        int | None,
        typer.Option("--min-bloat-bytes", help="ML301 ignores storages wasting fewer bytes. [default: 1024]", min=0),
    ] = None,
    fragmented_min_storages: Annotated[
        int | None,
        typer.Option("--fragmented-min-storages", help="ML204 stays quiet below this many storages. [default: 4]",
                     min=0),
    ] = None,
    align: Annotated[
        int | None,
        typer.Option("--align", help="ML203 asks every tensor for this boundary, in bytes (a power of two), as "
                     "`flatten --align` writes it. [default: the config's alignment, else each format's own]",
                     min=1, show_default=False),
    ] = None,
    min_shard_padding_bytes: Annotated[
        int | None,
        typer.Option("--min-shard-padding-bytes", help="ML303 ignores parameters whose shards are padded by fewer "
                     "bytes over all ranks. [default: 1048576]", min=0),
    ] = None,
    config: ConfigOption = None,
    isolated: IsolatedOption = False,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Hide the findings FILE records; report the ones fixed since.",
                                 metavar="FILE"),
    ] = None,
    write_baseline: Annotated[
        str | None, typer.Option("--write-baseline", help="Record the current findings in FILE (then as --baseline).",
                                 metavar="FILE"),
    ] = None,
    html: HtmlOption = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="The table lists every storage and finding, not the 20 largest storages of more than 50 "
            "and 5 findings per rule of more than 50.",
        ),
    ] = False,
    paths_from: PathsFromOption = None,
    jobs: JobsOption = 16,
    shard: ShardOption = None,
    timeout: TimeoutOption = 30,
    download: DownloadOption = False,
    trust: Annotated[bool, typer.Option("--trust", hidden=True)] = False,
    debug: DebugOption = False,
) -> int:
    """Report non-contiguous, duplicated, aliased, bloated and misaligned weights, for one path or several.

    Under torchrun (`torchrun --nproc_per_node N -m memlayout inspect pkg.module:build`), each rank reads its
    own pieces of the sharded model the builder returns, and rank 0 writes one report for all of them.
    """
    ranks = None
    if "WORLD_SIZE" in os.environ:  # a launcher's ranks; one process never imports what they need
        from memlayout.pipeline.ranks import RankExchange

        ranks = RankExchange.from_environment()
    def run() -> int:
        if trust:
            # inspect reads every format inertly, so there is nothing to allow. The
            # option is kept, hidden, only to say so: a user who passes it believes
            # inspect might run code, and deserves to learn it never does.
            raise UsageError(
                "inspect takes no --trust: it never runs code from the file, so there is nothing to allow",
                "drop --trust; only `memlayout flatten` of a pickled module needs it",
            )
        if align is not None and align & (align - 1):
            raise UsageError(f"--align {align} is not a power of two", "e.g. --align 64")
        targets = paths_to_inspect(paths, paths_from, shard)
        if not targets:
            print(f"memlayout: --shard {shard} takes none of the paths: nothing to inspect", file=sys.stderr)
            return 0
        remote = remote_reading(targets, timeout, download)
        from memlayout.pipeline.baseline import apply_baseline_flags
        from memlayout.pipeline.batch import inspect_paths

        settings = settings_with_flags(
            config, isolated, select=select, ignore=ignore, fail_on=fail_on, tie=tie,
            min_duplicate_bytes=min_duplicate_bytes, min_bloat_bytes=min_bloat_bytes,
            fragmented_min_storages=fragmented_min_storages, min_shard_padding_bytes=min_shard_padding_bytes,
            alignment=align,
        )
        if output_format is OutputFormat.JSONL:
            from memlayout.cli.inspect_stream import stream_json_lines

            refuse_with_streaming(html=html, baseline=baseline, write_baseline=write_baseline)
            return stream_json_lines(targets, settings, deep, remote, jobs, output, debug)
        with progress_callback(enabled=deep and len(targets) == 1) as progress, \
                paths_progress(len(targets)) as bar:
            batch = inspect_paths(
                targets, config=settings.rule_config(deep), select=settings.select, ignore=settings.ignore,
                fail_on=settings.fail_on, per_tensor_ignores=settings.per_tensor_ignores, progress=progress,
                debug=debug, exchange=ranks, remote=remote, jobs=jobs,
                done=lambda reports: bar.advance(1, sum(1 for r in reports if r.failed)),
            )
        if report_load_errors(batch):
            return USAGE_OR_LOAD_ERROR
        if ranks is not None and not ranks.first:
            return batch.exit_code()  # rank 0 writes the report and any file
        batch = apply_baseline_flags(batch, baseline, write_baseline)
        options = RenderOptions(color=terminal_color(output_format, output), show_all=show_all)
        write_reports(Command.INSPECT, batch, options, output_format, output, html)
        return batch.exit_code()

    return run() if ranks is None else ranks_agree_on_the_exit(ranks, run, debug)
