"""Options shared by several commands: each defined once here, as an Annotated alias or a builder.

A value an option does not take is one line naming the ones it does, worded the
same whichever command it is given to:
`memlayout: error: Invalid value for '--device': 'tpu' is not one of 'cpu', ...`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memlayout.cli.formats import Command, OutputFormat, formats_for, to_format
from memlayout.errors import UsageError
from memlayout.load.remote_location import RemoteOptions, remote_location
from memlayout.severity import FailOn

if TYPE_CHECKING:
    from memlayout.pipeline.config import Settings

DebugOption = Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")]
TrustOption = Annotated[
    bool,
    typer.Option("--trust", help="Allow real unpickling, which runs code from the file. Only for files you trust."),
]
MainModuleOption = Annotated[
    str | None,
    typer.Option("--main-module", help="With --trust: the module (on PYTHONPATH) that defines the classes a "
                 "model saved from a script pickles as __main__.Name.", metavar="MODULE"),
]
OutputOption = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the report to FILE instead of stdout.", metavar="FILE")
]
SelectOption = Annotated[
    list[str] | None,
    typer.Option("--select", help="Only these rule codes or prefixes (ML1, ML201); repeat or comma-separate.",
                 metavar="CODES"),
]
IgnoreOption = Annotated[
    list[str] | None,
    typer.Option("--ignore", help="Skip these rule codes or prefixes; repeat or comma-separate.", metavar="CODES"),
]
# --fail-on, --tie and --deep mean the same in inspect and diff, but each command's
# --help speaks of its own results only: inspect's never mentions diff's sides.
_FAIL_ON_HELP = "Exit 1 when {what} is at or above this severity. [default: the config's fail-on, else warning]"
InspectFailOnOption = Annotated[FailOn | None, typer.Option("--fail-on", help=_FAIL_ON_HELP.format(what="a finding"))]
DiffFailOnOption = Annotated[FailOn | None, typer.Option("--fail-on", help=_FAIL_ON_HELP.format(what="a change"))]
FlattenFailOnOption = Annotated[
    FailOn | None,
    typer.Option("--fail-on", help="With --check: " + _FAIL_ON_HELP.format(what="a finding flatten would fix")),
]
InspectTieOption = Annotated[
    list[str] | None,
    typer.Option("--tie", help="Declare TARGET=SOURCE tied (ML103); repeatable.", metavar="A=B"),
]
DiffTieOption = Annotated[
    list[str] | None,
    typer.Option("--tie", help="Declare TARGET=SOURCE tied, by B's names (ML103); repeatable.", metavar="A=B"),
]
InspectDeepOption = Annotated[
    bool, typer.Option("--deep", help="Read every value: NaN/Inf (ML503) and the full duplicate scan."),
]
DiffDeepOption = Annotated[
    bool,
    typer.Option("--deep", help="Read every value: NaN/Inf (ML503), the full duplicate scan, and the tensors "
                 "whose values changed."),
]
TimeoutOption = Annotated[
    int,
    typer.Option("--timeout", help="For URLs and Hub models: give up on a request, its redirects and retries "
                 "included, after SECONDS.", min=1, metavar="SECONDS"),
]
PathsFromOption = Annotated[
    str | None,
    typer.Option("--paths-from", help="Also inspect the paths FILE lists, one a line (- reads stdin; blank lines "
                 "and # comments are skipped).", metavar="FILE"),
]
JobsOption = Annotated[
    int,
    typer.Option("--jobs", "-j", help="Paths read at once; their remote reads share one connection pool. Local "
                 "files are read one at a time.", min=1, metavar="N"),
]
ShardOption = Annotated[
    str | None,
    typer.Option("--shard", help="Inspect every N-th path from the K-th (K from 1), to split a list across "
                 "machines; their --format jsonl outputs concatenate.", metavar="K/N"),
]
DownloadOption = Annotated[
    bool,
    typer.Option("--download", help="For URLs whose server ignores HTTP Range requests: download the whole file "
                 "instead of refusing."),
]


def remote_reading(targets: list[str], timeout: int, download: bool) -> RemoteOptions:
    """--timeout and --download as the loaders take them. Where a target is a URL or a Hub model, fsspec's HTTP
    transport starts importing in the background first (`start_importing_transport`), as the command's own
    imports go on."""
    if any(remote_location(target) is not None for target in targets):
        from memlayout.io.remote import start_importing_transport

        start_importing_transport()
    return RemoteOptions(timeout_s=timeout, download=download)


HtmlOption = Annotated[
    str | None,
    typer.Option("--html", help="Also write the self-contained HTML storage map (--format html) to FILE.",
                 metavar="FILE"),
]
MinDuplicateBytesOption = Annotated[
    int | None,
    typer.Option("--min-duplicate-bytes", help="ML102 ignores smaller tensors. [default: the config's, else 4096]",
                 min=0),
]
ConfigOption = Annotated[
    str | None,
    typer.Option("--config", help="Read settings from FILE instead of the nearest pyproject.toml's "
                 "[tool.memlayout].", metavar="FILE"),
]
IsolatedOption = Annotated[bool, typer.Option("--isolated", help="Read no configuration file.")]


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

_CUDA_INDEX = re.compile(r"cuda:\d+")


def device_parser(*supported: str) -> Callable[[Any], str]:
    """The `--device` value of a command that takes `supported` ("cuda:N" stands for any index).

    The error (a `ValueError`, which the parser words as an invalid value) names
    the devices the command takes.
    """

    def parse(value: Any) -> str:
        device = str(value).strip().lower()
        if device in supported or ("cuda:N" in supported and _CUDA_INDEX.fullmatch(device)):
            return device
        raise ValueError(f"{value!r} is not one of {_choices(supported)}.")

    return parse


def device_option(*supported: str, help: str) -> Any:
    """`--device` for a command that takes the devices `supported`, e.g. ("cpu", "cuda", "cuda:N")."""
    return typer.Option("--device", parser=device_parser(*supported), metavar=f"[{'|'.join(supported)}]", help=help)


def number(value: Any) -> float:
    """A finite number as Python's float() reads it ("1", "0.5", "1e3"); the request's rules judge its range.

    A ValueError, which the option's parser words as an invalid value.
    """
    return _finite(value, "a finite number: give one such as 1.0")


def probability(value: Any) -> float:
    """A probability from 0 to 1, as torch's Dropout takes one: "0.05", "5%"; the error names the range.

    A ValueError, which the option's parser words as an invalid value.
    """
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a probability: give one from 0 to 1, e.g. 0.05") from None
    if not 0 <= number <= 1:
        raise ValueError(f"{value!r} is not from 0 to 1")
    return number


def mebibytes(value: Any) -> float:
    """A size in MiB that may have a fraction, as DDP's bucket_cap_mb takes one: "25", "0.5".

    A ValueError, which the option's parser words as an invalid value; whether the size is one is the caller's.
    """
    return _finite(value, "a number of MiB: give one such as 25 or 0.5")


def _finite(value: Any, wanted: str) -> float:
    """`value` as a finite float, or a ValueError that says it is not `wanted`."""
    try:
        number = float(str(value).strip())
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not {wanted}")
    return number


def split_codes(values: list[str] | None) -> list[str]:
    """`--select ML1,ML201 --select ML5` -> ["ML1", "ML201", "ML5"], upper-cased."""
    return [code.strip().upper() for value in values or [] for code in value.split(",") if code.strip()]


def rule_codes(values: list[str] | None, flag: str) -> tuple[str, ...] | None:
    """`--select`/`--ignore`'s codes, each checked against the rules; None when the flag was not given.

    Raises:
        UsageError: a code no rule has, named with the flag.
    """
    from memlayout.pipeline.config import check_codes

    return check_codes(split_codes(values), flag) if values else None


def parse_ties(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--tie TARGET=SOURCE ...` -> ((target, source), ...).

    Raises:
        UsageError: a value that is not TARGET=SOURCE.
    """
    ties = []
    for value in values or []:
        target, sep, source = value.partition("=")
        if not sep or not target.strip() or not source.strip():
            raise UsageError(f"--tie {value!r} is not of the form TARGET=SOURCE",
                             "e.g. --tie lm_head.weight=embed.weight")
        ties.append((target.strip(), source.strip()))
    return tuple(ties)


def settings_with_flags(
    config: str | None,
    isolated: bool,
    *,
    select: list[str] | None,
    ignore: list[str] | None,
    fail_on: FailOn | None,
    tie: list[str] | None,
    **thresholds: int | None,
) -> Settings:
    """The project's `[tool.memlayout]` settings (`--config`, `--isolated`), each flag given replacing its value.

    inspect and diff read their settings this one way, so a flag means the same to both.
    """
    from memlayout.pipeline.config import resolve_settings

    return resolve_settings(config, isolated).overridden(
        select=rule_codes(select, "--select"), ignore=rule_codes(ignore, "--ignore"),
        fail_on=fail_on, ties=parse_ties(tie) if tie else None, **thresholds,
    )
