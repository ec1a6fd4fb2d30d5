"""`memlayout flatten`: check flags, call the library, print its summary."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from memlayout.cli.errors import USAGE_OR_LOAD_ERROR
from memlayout.cli.options import DebugOption, MainModuleOption, TrustOption, device_option
from memlayout.errors import MemlayoutError, UsageError
from memlayout.output.writer import write_output

if TYPE_CHECKING:
    from memlayout.flatten.options import FlattenOptions

ALREADY_FLAT = 0
WOULD_CHANGE = 1


def _check_each(paths: list[str], options: "FlattenOptions", debug: bool) -> int:
    """`--check` over several paths: each one's verdict, a load error for one not stopping the others.

    Returns the exit code: 2 when no path could be checked, 1 when any would change
    or failed, 0 when every one is already flat.
    """
    from memlayout.flatten.files import flatten_path
    from memlayout.flatten.summary import render_check

    failed = changed = 0
    for path in paths:
        try:
            result = flatten_path(path, options)
        except MemlayoutError as exc:
            if debug:
                raise
            message = exc.one_line()
            print(f"memlayout: error: {message if path in message else f'{path}: {message}'}", file=sys.stderr)
            failed += 1
            continue
        write_output(render_check(result), None)
        changed += not result.already_flat
    if failed == len(paths):
        return USAGE_OR_LOAD_ERROR
    return WOULD_CHANGE if failed or changed else ALREADY_FLAT


def flatten_command(
    paths: Annotated[
        list[str],
        typer.Argument(help="Checkpoint file, model directory, or pkg.module:factory (several with --check).",
                       metavar="IN..."),
    ],
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
    align: Annotated[int, typer.Option("--align", help="Slot alignment in bytes (a power of two).", min=1)] = 64,
    trust: TrustOption = False,
    main_module: MainModuleOption = None,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 0 if every IN is already flat, 1 if flatten would "
                           "change one.")
    ] = False,
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
    options = FlattenOptions(
        out=output, device=device, align=align, trust=trust, main_module=main_module, check=check,
        in_place=in_place, verify=not no_verify, force=force, to=to, tensors_only=tensors_only,
    )
    if check:
        code = _check_each(paths, options, debug)
    elif len(paths) > 1:
        raise UsageError(f"flatten writes one IN at a time, and {len(paths)} were given",
                         "pass one IN with -o OUT, or several with --check")
    else:
        from memlayout.cli.progress import FLATTEN_STAGES, stage_progress

        # Bytes copied and verified, on stderr when it is a terminal; silent otherwise.
        with stage_progress(FLATTEN_STAGES) as progress:
            result = flatten_path(paths[0], options, progress)
        write_output(render_summary(result), None)
        code = ALREADY_FLAT
    return code
