"""Options shared by several commands, as Annotated aliases."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Annotated, Any

import typer

from memlayout.cli.formats import Command, OutputFormat, formats_for, to_format


class FailOn(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    NEVER = "never"


DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")]
TrustOption = Annotated[
    bool,
    typer.Option("--trust", help="Allow real unpickling, which runs code from the file. Only for files you trust."),
]
OutputOption = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the report to FILE instead of stdout.", metavar="FILE")
]
SelectOption = Annotated[
    list[str] | None,
    typer.Option("--select", help="Only these rule codes or prefixes (ML1, ML201); repeat or comma-separate."),
]
IgnoreOption = Annotated[
    list[str] | None,
    typer.Option("--ignore", help="Skip these rule codes or prefixes; repeat or comma-separate."),
]
FailOnOption = Annotated[
    FailOn, typer.Option("--fail-on", help="Exit 1 when a finding is at or above this severity.")
]


def _choices(values: tuple[str, ...]) -> str:
    return ", ".join(repr(value) for value in values)


def format_parser(command: Command) -> Callable[[Any], OutputFormat]:
    """The `--format` value of `command`: a name the registry gives it a formatter for, any case.

    The error (a `ValueError`, which the parser words as an invalid value) names
    the formats `command` writes, and the command that writes a name it does not.
    """
    accepted = formats_for(command)

    def parse(value: Any) -> OutputFormat:
        if isinstance(value, OutputFormat):  # the default
            return value
        try:
            fmt = OutputFormat(str(value).lower())
        except ValueError:
            fmt = None
        if fmt is not None and fmt in accepted:
            return fmt
        names = _choices(tuple(f.value for f in accepted))
        if fmt is None:
            raise ValueError(f"{value!r} is not one of {names}.")
        writers = " and ".join(writer.value for writer in to_format(fmt).commands())
        raise ValueError(f"{value!r} is not one of {names} ({fmt.value} is for {writers}).")

    return parse


def format_option(command: Command) -> Any:
    """`--format`/`-f` for `command`: the names `memlayout.cli.formats` gives it."""
    names = "|".join(fmt.value for fmt in formats_for(command))
    return typer.Option("--format", "-f", parser=format_parser(command), metavar=f"[{names}]",
                        help="The report's format.")


InspectFormatOption = Annotated[OutputFormat, format_option(Command.INSPECT)]
DiffFormatOption = Annotated[OutputFormat, format_option(Command.DIFF)]
ActivationsFormatOption = Annotated[OutputFormat, format_option(Command.ACTIVATIONS)]


def split_codes(values: list[str] | None) -> list[str]:
    """`--select ML1,ML201 --select ML5` -> ["ML1", "ML201", "ML5"], upper-cased."""
    return [code.strip().upper() for value in values or [] for code in value.split(",") if code.strip()]
