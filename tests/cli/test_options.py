"""Options shared by several commands are defined once (cli/options.py): the same flag reads, helps and
fails the same way whichever command it is given to."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.cli.formats import Command, formats_for
from memlayout.cli.options import device_parser

DEMO = str(Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt")
MODEL = ["tests.activations.models:flat_cnn", "--input", "float32[2,3,16,16]"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _command(name: str) -> Any:
    # typer's own click (vendored in recent releases), reached through typer.
    group: Any = typer.main.get_command(app)
    command = group.get_command(typer.Context(group), name)
    assert command is not None
    return command


def _option(command: str, flag: str) -> Any:
    return next(p for p in _command(command).params if flag in getattr(p, "opts", ()))


@pytest.mark.parametrize(
    "flag",
    ["--format", "--output", "--select", "--ignore", "--fail-on", "--tie", "--deep", "--html",
     "--min-duplicate-bytes", "--config", "--isolated", "--debug"],
)
def test_inspect_and_diff_share_each_option(flag: str) -> None:
    inspect, diff = _option("inspect", flag), _option("diff", flag)
    assert (inspect.opts, inspect.secondary_opts, inspect.metavar) == (
        diff.opts, diff.secondary_opts, diff.metavar
    ) or flag == "--format"  # the same option; its choices are each command's (test_formats.py)
    assert inspect.default == diff.default
    # The same flag, helped in each command's own words where the two differ in what
    # they judge (findings or changes); see test_a_commands_help_speaks_only_of_that_command.
    assert inspect.help == diff.help or flag in ("--format", "--fail-on", "--tie", "--deep")


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    torch.save({"w": torch.zeros(4, 4)}, tmp_path / "w.pt")
    return str(tmp_path / "w.pt")


@pytest.mark.parametrize("command", list(Command), ids=lambda c: c.value)
def test_an_unknown_format_is_the_same_one_line_error_naming_what_each_command_writes(
    command: Command, checkpoint: str
) -> None:
    args = {Command.INSPECT: [checkpoint], Command.DIFF: [checkpoint, checkpoint], Command.ACTIVATIONS: MODEL}
    code, out, err = invoke(command.value, *args[command], "--format", "xml")
    names = ", ".join(repr(f.value) for f in formats_for(command))
    assert (code, out) == (2, "")
    assert err == f"memlayout: error: Invalid value for '--format' / '-f': 'xml' is not one of {names}.\n"


@pytest.mark.parametrize(
    ("command", "devices"),
    [("flatten", "'keep', 'cpu', 'cuda', 'cuda:N', 'auto'"), ("activations", "'cpu', 'cuda', 'cuda:N', 'meta'")],
)
@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "gpu0"])
def test_a_device_a_command_does_not_take_is_the_same_one_line_error(
    command: str, devices: str, device: str, checkpoint: str, tmp_path: Path
) -> None:
    args = [checkpoint, "-o", str(tmp_path / "flat.pt")] if command == "flatten" else MODEL
    code, out, err = invoke(command, *args, "--device", device)
    assert (code, out) == (2, "")
    assert err == f"memlayout: error: Invalid value for '--device': {device!r} is not one of {devices}.\n"
    assert not (tmp_path / "flat.pt").exists()


def test_meta_is_a_device_for_activations_only(checkpoint: str, tmp_path: Path) -> None:
    code, _, err = invoke("flatten", checkpoint, "-o", str(tmp_path / "flat.pt"), "--device", "meta")
    assert code == 2 and "'meta' is not one of 'keep', 'cpu', 'cuda', 'cuda:N', 'auto'." in err
    code, _, err = invoke("activations", *MODEL, "--device", "auto")
    assert code == 2 and "'auto' is not one of 'cpu', 'cuda', 'cuda:N', 'meta'." in err


def test_the_device_parser_takes_any_cuda_index_where_cuda_is_taken() -> None:
    parse = device_parser("cpu", "cuda", "cuda:N")
    assert [parse(v) for v in ("cpu", "cuda", "cuda:0", "cuda:12", " CUDA:1 ")] == [
        "cpu", "cuda", "cuda:0", "cuda:12", "cuda:1",
    ]
    with pytest.raises(ValueError, match=re.escape("'cuda:N' is not one of")):
        parse("cuda:N")
    with pytest.raises(ValueError, match=re.escape("'cuda:0' is not one of 'cpu', 'meta'.")):
        device_parser("cpu", "meta")("cuda:0")


@pytest.mark.parametrize("command", ["inspect", "diff"])
def test_fail_on_and_select_errors_read_the_same_in_inspect_and_diff(command: str) -> None:
    paths = [DEMO] if command == "inspect" else [DEMO, DEMO]
    code, _, err = invoke(command, *paths, "--fail-on", "bogus")
    assert code == 2 and err.startswith("memlayout: error: Invalid value for '--fail-on': 'bogus' is not one of")
    code, _, err = invoke(command, *paths, "--select", "ML1,ML999")
    assert (code, err) == (2, "memlayout: error: --select: unknown rule code 'ML999' (`memlayout rules` lists them)\n")


@pytest.mark.parametrize(("command", "foreign"), [("inspect", ("diff", "B's", "A's", "a change")),
                                                  ("diff", ("a finding is at",))])
def test_a_commands_help_speaks_only_of_that_command(command: str, foreign: tuple[str, ...]) -> None:
    """Shared options are defined once, but inspect's --help says nothing about diff's sides or changes."""
    helped = " ".join(_command(command).get_help(typer.Context(_command(command))).split())
    for text in foreign:
        assert text not in helped, text
