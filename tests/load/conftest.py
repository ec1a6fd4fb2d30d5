"""Shared fixtures for loader tests: checkpoints written into tmp_path by the real writers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app


@dataclass(frozen=True)
class CliResult:
    """What one CLI run returned."""

    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run `memlayout ARGS` in-process and capture both streams separately."""
    result = CliRunner().invoke(app, list(args))
    return CliResult(result.exit_code, result.stdout, result.stderr)


def assert_one_line_error(result: CliResult, *fragments: str) -> None:
    """Exit 2, exactly one stderr line, no traceback, and the line names the problem."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert lines[0].startswith("memlayout: error:")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """A file a malicious payload would create; tests assert it never appears."""
    return tmp_path / "PWNED"
