"""Options shared by several commands, as Annotated aliases."""

from __future__ import annotations

import enum
from typing import Annotated

import typer


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


def split_codes(values: list[str] | None) -> list[str]:
    """`--select ML1,ML201 --select ML5` -> ["ML1", "ML201", "ML5"], upper-cased."""
    return [code.strip().upper() for value in values or [] for code in value.split(",") if code.strip()]
