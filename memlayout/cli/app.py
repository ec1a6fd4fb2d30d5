"""The `memlayout` command: one typer app; each command lives in its own module.

Heavy imports (torch, rich tables) happen inside commands, so `memlayout --help`
and metadata inspection start fast.
"""

from __future__ import annotations

import sys

import typer

from memlayout import __version__
from memlayout.cli.flatten_command import flatten_command
from memlayout.cli.inspect_command import inspect_command
from memlayout.cli.rules_command import explain_command, rules_command

app = typer.Typer(
    name="memlayout",
    help="Memory-layout diagnostics for PyTorch models and checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"memlayout {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """Memory-layout diagnostics for PyTorch models and checkpoints."""


app.command("inspect")(inspect_command)
app.command("rules")(rules_command)
app.command("explain")(explain_command)
app.command("flatten")(flatten_command)


def main(argv: list[str] | None = None) -> int:
    """The whole CLI entry: run the app and return its exit code."""
    try:
        app(args=argv, prog_name="memlayout", standalone_mode=True)
    except SystemExit as exit_:
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
