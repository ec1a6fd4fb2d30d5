"""The `memlayout` command: one typer app; each command lives in its own module.

Heavy imports (torch, rich tables) happen inside commands, so `memlayout --help`
and metadata inspection start fast.
"""

from __future__ import annotations

import enum
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

import typer
import typer.models

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
    args = sys.argv[1:] if argv is None else list(argv)
    direct = _direct_call(args)
    if direct is not None:
        return direct
    try:
        app(args=args, prog_name="memlayout", standalone_mode=True)
    except SystemExit as exit_:
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else 2
    return 0


# Commands a well-formed command line may call directly, skipping typer's parser.
# typer builds a pydantic TypeAdapter for every parameter on every run, importing
# pydantic to do so: ~120 ms of a ~240 ms `memlayout inspect`, for a tool meant to
# run in pre-commit hooks. The direct path reads option names, defaults and types
# from the same Annotated declarations typer reads, so the two cannot drift; any
# argument it does not fully understand (--help, a typo, a bad value, `--`) goes to
# typer, which owns every usage message.
_DIRECT_COMMANDS: dict[str, Callable[..., None]] = {"inspect": inspect_command}


def _direct_call(args: list[str]) -> int | None:
    """Run a command without typer's parser; None when typer must handle these arguments."""
    if not args or args[0] not in _DIRECT_COMMANDS:
        return None
    command = _DIRECT_COMMANDS[args[0]]
    kwargs = _parse_direct(command, args[1:])
    if kwargs is None:
        return None
    try:
        command(**kwargs)
    except typer.Exit as exit_:
        return int(exit_.exit_code)
    return 0


def _parse_direct(command: Callable[..., None], args: list[str]) -> dict[str, Any] | None:
    hints = typing.get_type_hints(command, include_extras=True)
    positional: list[str] = []
    options: dict[str, tuple[str, Any]] = {}
    kwargs: dict[str, Any] = {}
    for name, parameter in inspect.signature(command).parameters.items():
        annotation = hints[name]
        info = next((m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, typer.models.ParameterInfo)), None)
        kind = typing.get_args(annotation)[0] if info is not None else annotation
        if isinstance(info, typer.models.ArgumentInfo):
            positional.append(name)
            continue
        if not isinstance(info, typer.models.OptionInfo):
            return None
        declared = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str) and d.startswith("-")]
        for flag in declared or [f"--{name.replace('_', '-')}"]:
            options[flag] = (name, kind)
        kwargs[name] = parameter.default
        if info.min is not None:
            options[f"min:{name}"] = (name, info.min)
    values: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if not token.startswith("-") or token == "-":
            values.append(token)
            continue
        flag, equals, inline = token.partition("=")
        if flag not in options:
            return None
        name, kind = options[flag]
        if kind is bool:
            if equals:
                return None
            kwargs[name] = True
            continue
        if not equals:
            if index >= len(args):
                return None
            inline = args[index]
            index += 1
        value = _convert(kind, inline, options.get(f"min:{name}"))
        if value is None:
            return None
        if typing.get_origin(kind) is list or list in (typing.get_origin(a) for a in typing.get_args(kind)):
            kwargs[name] = [*(kwargs[name] or []), value]
        else:
            kwargs[name] = value
    if len(values) != len(positional):
        return None
    kwargs.update(zip(positional, values, strict=True))
    return kwargs


def _convert(kind: Any, text: str, minimum: tuple[str, Any] | None) -> Any:
    # Only the types memlayout's commands declare; anything else is typer's to parse.
    base = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
    if typing.get_origin(base) is list:
        base = typing.get_args(base)[0]
    if base is str:
        return text
    if base is int:
        try:
            number = int(text)
        except ValueError:
            return None
        return number if minimum is None or number >= minimum[1] else None
    if isinstance(base, type) and issubclass(base, enum.Enum):
        try:
            return base(text)
        except ValueError:
            return None
    return None


if __name__ == "__main__":
    sys.exit(main())
