"""The activations page's examples are real: each command runs and prints what docs/activations.md shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "activations.md").read_text()
EXAMPLES = re.findall(r"```console\n\$ memlayout (activations .+?)\n(.*?)```", PAGE, flags=re.DOTALL)


def test_the_page_has_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("command, shown", EXAMPLES, ids=[c[:60] for c, _ in EXAMPLES])
def test_example_output_is_what_the_command_prints(
    command: str, shown: str, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, shlex.split(command))
    assert result.exit_code in (0, 1), result.stderr
    if result.exit_code == 0:
        assert result.stdout.rstrip("\n") == shown.rstrip("\n")
    else:  # the budget's one line (transformers may log its own lines to stderr too)
        ours = [line for line in result.stderr.splitlines() if line.startswith("memlayout: ")]
        assert ours == shown.rstrip("\n").splitlines()
