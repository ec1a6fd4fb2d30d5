"""`memlayout flatten`: check flags, call the library, print its summary."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from memlayout.cli.options import (
    ConfigOption,
    DebugOption,
    FlattenFailOnOption,
    IsolatedOption,
    MainModuleOption,
    TrustOption,
    device_option,
    settings_with_flags,
)
from memlayout.errors import UsageError
from memlayout.output.writer import write_output

if TYPE_CHECKING:
    from memlayout.flatten.options import FlattenOptions
    from memlayout.pipeline.config import Settings

ALREADY_FLAT = 0


def _check_each(targets: list[str], options: "FlattenOptions", settings: "Settings", debug: bool) -> int:
    """`--check` over the paths, as inspect reads them: each verdict as it comes, then a summary.

    Returns the exit code: 2 when no path could be checked, 1 when one would change or
    could not be checked, 0 when every one passes.
    """
    from memlayout.pipeline.flatten_check import CheckBatch, check_paths
    from memlayout.report.flatten_check import render_data_line, render_summary, render_verdict

    checked = []
    for verdict in check_paths(targets, options, settings, debug):
        checked.append(verdict)
        if verdict.error is not None:
            print(f"memlayout: error: {verdict.error}", file=sys.stderr)
        else:
            write_output(render_verdict(verdict, settings.fail_on), None)
    batch = CheckBatch(tuple(checked), settings.fail_on)
    # One model folder given alone keeps its one line, as `inspect` keeps its one report:
    # its config and tokenizer files are accounted for below it, not made paths.
    if len(targets) > 1 or [c.path for c in batch.checked] != targets:
        write_output(render_summary(batch), None)
    else:
        write_output(render_data_line(batch), None)
    return batch.exit_code()


def _targets(paths: list[str] | None, paths_from: str | None) -> list[str]:
    from memlayout.pipeline.many_paths import read_path_list

    targets = list(paths or [])
    if paths_from is not None:
        targets += read_path_list(paths_from)
    if not targets:
        where = f"--paths-from {paths_from} lists none" if paths_from is not None else "none was given"
        raise UsageError(f"no path to flatten: {where}", "give IN, or with --check several, or --paths-from FILE")
    return targets


def flatten_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Checkpoint file, model directory, or pkg.module:factory; with --check, several, and "
                       "folders of checkpoints, as inspect reads them.", metavar="IN...", show_default=False),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Where to write the flat copy (IN's format, or --to's). flatten "
                     "replaces only what you name: an existing file OUT is replaced, as cp does; an existing folder "
                     "OUT that holds files is refused without --force, since -o named the folder, not its files.",
                     metavar="OUT"),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="Write OUT as safetensors (from a torch.save or legacy file, or a model "
                     "directory of .bin shards), without running IN's pickle; ties are stored once, as "
                     "transformers stores them.", metavar="safetensors"),
    ] = None,
    tensors_only: Annotated[
        bool,
        typer.Option("--tensors-only", help="With --to: leave out what is not a tensor (optimizer settings, step "
                     "counters, pickled modules) instead of refusing."),
    ] = False,
    device: Annotated[
        str,
        device_option("keep", "cpu", "cuda", "cuda:N", "auto",
                      help="keep: OUT records each tensor's device as IN does (no GPU needed); cpu, cuda, cuda:N: "
                      "move every tensor there; auto: CUDA if available, else CPU."),
    ] = "keep",
    align: Annotated[
        int | None,
        typer.Option("--align", help="Alignment asked for, in bytes (a power of two): every slot starts on it, and "
                     "so does a safetensors data section, which otherwise keeps the format's own 8 bytes; --check "
                     "then fails a tensor off it (ML203). [default: the config's alignment, else 64-byte slots]",
                     min=1, show_default=False),
    ] = None,
    trust: TrustOption = False,
    main_module: MainModuleOption = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if flatten would fix a finding at or above "
                           "--fail-on in some IN, 0 if it would fix none (one line a path says why).")
    ] = False,
    fail_on: FlattenFailOnOption = None,
    paths_from: Annotated[
        str | None,
        typer.Option("--paths-from", help="With --check: also check the paths FILE lists, one a line (- reads stdin; "
                     "blank lines and # comments are skipped).", metavar="FILE"),
    ] = None,
    config: ConfigOption = None,
    isolated: IsolatedOption = False,
    in_place: Annotated[bool, typer.Option("--in-place", help="Replace IN with its flat copy.")] = False,
    no_verify: Annotated[
        bool, typer.Option("--no-verify", help="Skip reloading OUT to compare values and sharing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Write into a folder OUT that holds files, replacing only the files flatten "
                     "writes and keeping the others."),
    ] = False,
    debug: DebugOption = False,
) -> int:
    """Rewrite a model into flat, aligned buffers and save it in the same format (or --to safetensors), losing nothing."""
    from memlayout.flatten.files import flatten_path
    from memlayout.flatten.options import FlattenOptions
    from memlayout.flatten.plan import check_align
    from memlayout.flatten.summary import render_summary
    from memlayout.flatten.writers import targets

    if to is not None and to not in targets():
        raise UsageError(f"--to {to} is not a format flatten writes", f"use --to {' or '.join(targets())}")
    if tensors_only and to is None:
        raise UsageError("--tensors-only applies to a conversion", "pass --to safetensors with it")
    if main_module is not None and to is not None:
        raise UsageError(f"--main-module applies when IN is unpickled, and --to {to} reads it without running it",
                         "drop --main-module")
    if main_module is not None and not trust:
        raise UsageError("--main-module applies when the pickle is unpickled for real, which only --trust allows",
                         "add --trust, only if you trust whoever wrote the file")
    inputs = _targets(paths, paths_from)
    if not check and len(inputs) > 1:
        raise UsageError(f"flatten writes one IN at a time, and {len(inputs)} were given",
                         "pass one IN with -o OUT, or several with --check")
    if align is not None:
        check_align(align)
    if fail_on is not None and not check:
        raise UsageError("--fail-on judges findings, which only --check does", "add --check, or drop --fail-on")
    # The project's settings: the findings --check judges, and the alignment it asks for,
    # which flatten itself then writes, so that the two agree.
    settings = settings_with_flags(config, isolated, select=None, ignore=None, fail_on=fail_on, tie=None,
                                   alignment=align)
    options = FlattenOptions(
        out=output, device=device, align=settings.rules.alignment, trust=trust, main_module=main_module,
        check=check, in_place=in_place, verify=not no_verify, force=force, to=to, tensors_only=tensors_only,
    )
    if check:
        code = _check_each(inputs, options, settings, debug)
    else:
        from memlayout.cli.progress import FLATTEN_STAGES, stage_progress

        # Bytes copied and verified, on stderr when it is a terminal; silent otherwise.
        with stage_progress(FLATTEN_STAGES) as progress:
            result = flatten_path(inputs[0], options, progress)
        write_output(render_summary(result), None)
        code = ALREADY_FLAT
    return code
