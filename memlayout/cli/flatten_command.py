"""`memlayout flatten`: check flags, call the library, print its summary."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memlayout.cli.errors import one_line_errors
from memlayout.cli.options import DebugOption, TrustOption

ALREADY_FLAT = 0
WOULD_CHANGE = 1


def flatten_command(
    path: Annotated[str, typer.Argument(help="Checkpoint file, model directory, or pkg.module:factory.", metavar="IN")],
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Where to write the flat copy (same format as IN).", metavar="OUT")
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="auto (CUDA if available), cpu, cuda or cuda:N.", metavar="DEVICE")
    ] = "auto",
    align: Annotated[int, typer.Option("--align", help="Slot alignment in bytes (a power of two).", min=1)] = 64,
    trust: TrustOption = False,
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 0 if IN is already flat, 1 if flatten would change it.")
    ] = False,
    in_place: Annotated[bool, typer.Option("--in-place", help="Replace IN with its flat copy.")] = False,
    no_verify: Annotated[
        bool, typer.Option("--no-verify", help="Skip reloading OUT to compare values and sharing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Write into a non-empty OUT folder, replacing only the files flatten writes."),
    ] = False,
    debug: DebugOption = False,
) -> None:
    """Rewrite a model into flat, aligned buffers and save it in the same format, losing nothing."""
    with one_line_errors(debug):
        from memlayout.flatten.files import flatten_path
        from memlayout.flatten.options import FlattenOptions
        from memlayout.flatten.summary import render_check, render_summary

        options = FlattenOptions(
            out=output, device=device, align=align, trust=trust, check=check, in_place=in_place, verify=not no_verify,
            force=force,
        )
        result = flatten_path(path, options)
        sys.stdout.write(render_check(result) if check else render_summary(result))
    if check and not result.already_flat:
        raise typer.Exit(WOULD_CHANGE)
