"""The one registry of output formats (cli/formats.py): every name maps to formatters, and every
command's `--format` accepts exactly the names the registry gives it."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.cli.formats import (
    Command,
    Format,
    OutputFormat,
    RenderOptions,
    formats_for,
    supported,
    to_format,
)
from memlayout.cli.options import format_parser
from memlayout.errors import UsageError
from memlayout.output.interface import Formatter

# Where each command's results live, and so its formatters: one module per format.
HOME = {Command.INSPECT: "memlayout.report.", Command.DIFF: "memlayout.diff.",
        Command.ACTIVATIONS: "memlayout.activations."}


def factories(entry: Format) -> dict[Command, object]:
    return {Command.INSPECT: entry.inspect, Command.DIFF: entry.diff, Command.ACTIVATIONS: entry.activations}


@pytest.mark.parametrize("fmt", list(OutputFormat), ids=lambda f: f.value)
def test_every_format_name_has_a_formatter_for_some_command(fmt: OutputFormat) -> None:
    entry = to_format(fmt)
    assert entry.commands(), f"{fmt.value} is written by no command"
    for command, make in factories(entry).items():
        assert (command in entry.commands()) == (make is not None)


@pytest.mark.parametrize("command", list(Command), ids=lambda c: c.value)
def test_each_format_of_a_command_is_its_own_module_beside_its_results(command: Command) -> None:
    modules = []
    for fmt in formats_for(command):
        make = factories(to_format(fmt))[command]
        formatter = make(RenderOptions())  # type: ignore[operator]
        assert isinstance(formatter, Formatter)
        modules.append(type(formatter).__module__)
    assert all(module.startswith(HOME[command]) for module in modules), modules
    assert len(set(modules)) == len(modules), f"two formats of {command.value} share a module: {modules}"


def test_what_each_command_writes() -> None:
    assert [f.value for f in formats_for(Command.INSPECT)] == [
        "table", "json", "sarif", "github", "markdown", "junit", "html", "jsonl",
    ]
    assert [f.value for f in formats_for(Command.DIFF)] == ["table", "json", "markdown", "html"]
    assert [f.value for f in formats_for(Command.ACTIVATIONS)] == ["table", "json"]


@pytest.mark.parametrize("command", list(Command), ids=lambda c: c.value)
def test_the_cli_choices_are_the_registry(command: Command) -> None:
    parse = format_parser(command)
    for fmt in OutputFormat:
        if fmt in formats_for(command):
            assert parse(fmt.value) is fmt and parse(fmt.value.upper()) is fmt
        else:
            with pytest.raises(ValueError, match=f"'{fmt.value}' is not one of"):
                parse(fmt.value)
    # --help shows the same choices.
    help_text = CliRunner().invoke(app, [command.value, "--help"], terminal_width=200).stdout
    shown = re.search(r"-f, --format \[([a-z|]+)\]", help_text)
    assert shown is not None, help_text
    assert shown.group(1).split("|") == [f.value for f in formats_for(command)]


def test_a_format_a_command_does_not_write_is_a_usage_error_naming_those_it_does() -> None:
    with pytest.raises(UsageError) as caught:
        supported(to_format(OutputFormat.SARIF).diff, OutputFormat.SARIF, Command.DIFF)
    assert caught.value.one_line() == "diff does not write --format sarif (it writes table, json, markdown, html)"
    make = supported(to_format(OutputFormat.JSON).diff, OutputFormat.JSON, Command.DIFF)
    assert make is to_format(OutputFormat.JSON).diff
