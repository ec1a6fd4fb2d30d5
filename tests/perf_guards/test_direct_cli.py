"""The CLI's direct path (typer's parser skipped for speed) behaves exactly like typer's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import _parse_direct, app, main
from memlayout.cli.inspect_command import inspect_command
from memlayout.cli.options import FailOn


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("direct") / "model.pt"
    base = torch.randn(64, 64)
    torch.save({"w": base, "copy": base.clone(), "t": torch.randn(8, 8).t()}, path)
    return path


@pytest.mark.parametrize(
    "extra",
    [
        ["--format", "json"],
        ["-f", "json", "--select", "ML1,ML2", "--fail-on=never"],
        ["--format=json", "--ignore", "ML102", "--ignore", "ML2", "--min-duplicate-bytes", "0"],
        ["--deep", "-f", "json", "--tie", "w=copy"],
        [],
    ],
)
def test_direct_path_matches_typer(
    checkpoint: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["inspect", str(checkpoint), *extra]
    assert _parse_direct(inspect_command, args[1:]) is not None
    code = main(args)
    direct = capsys.readouterr()
    expected = CliRunner().invoke(app, args)
    assert code == expected.exit_code
    assert direct.out == expected.stdout
    assert direct.err == expected.stderr


def test_direct_parse_reads_the_declared_options() -> None:
    kwargs = _parse_direct(
        inspect_command, ["m.pt", "-f", "json", "--select", "ML1", "--select", "ML2", "--fail-on", "error", "--deep"]
    )
    assert kwargs is not None
    assert kwargs["path"] == "m.pt" and kwargs["output_format"] == "json"
    assert kwargs["select"] == ["ML1", "ML2"] and kwargs["fail_on"] is FailOn.ERROR and kwargs["deep"] is True
    assert kwargs["min_duplicate_bytes"] == 4096 and kwargs["trust"] is False


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["m.pt", "--bogus"],
        ["m.pt", "--fail-on", "sometimes"],
        ["m.pt", "--min-duplicate-bytes", "-1"],
        ["m.pt", "--min-duplicate-bytes", "many"],
        ["m.pt", "--format"],
        ["m.pt", "--deep=yes"],
        ["m.pt", "other.pt"],
        [],
        ["--", "-weird.pt"],
    ],
)
def test_anything_unusual_is_left_to_typer(args: list[str]) -> None:
    assert _parse_direct(inspect_command, args) is None
