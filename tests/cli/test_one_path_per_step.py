"""inspect and diff share one path for each step they have in common (issue 30 §4).

Each once had its own copy of reading the settings with the flags over them and
of writing --html, then --format; the baseline went from the CLI into
pipeline.batch and back. These tests follow both commands through the one path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import memlayout.cli.options
from memlayout.cli.app import main
from memlayout.cli.formats import Command


@pytest.fixture
def two_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    torch.save({"w": torch.zeros(2, 2)}, tmp_path / "a.pt")
    torch.save({"w": torch.zeros(2, 2).half()}, tmp_path / "b.pt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_both_commands_write_their_reports_through_one_function(
    two_checkpoints: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Command, str | None]] = []
    from memlayout.cli.formats import write_reports as real

    def spy(command: Command, result: Any, render: Any, fmt: Any, output: str | None, html: str | None) -> None:
        calls.append((command, html))
        real(command, result, render, fmt, output, html)

    # Each command module bound the name when it was imported: the spy replaces it there.
    for module in ("memlayout.cli.inspect_command", "memlayout.cli.diff_command"):
        monkeypatch.setattr(f"{module}.write_reports", spy)
    assert main(["inspect", "a.pt", "--html", "map.html", "--isolated"]) == 0
    assert main(["diff", "a.pt", "b.pt", "--html", "diff.html", "--isolated", "--fail-on", "never"]) == 0
    assert calls == [(Command.INSPECT, "map.html"), (Command.DIFF, "diff.html")]
    assert (two_checkpoints / "map.html").read_text().startswith("<!")
    assert (two_checkpoints / "diff.html").read_text().startswith("<!")


def test_an_unwritable_html_page_stops_the_command_before_its_report(
    two_checkpoints: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["inspect", "a.pt"], ["diff", "a.pt", "b.pt"]):
        assert main([*argv, "--html", "no-such-folder/page.html", "--isolated"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("memlayout: error: ") and err.count("\n") == 1


def test_both_commands_read_their_settings_through_one_function(
    two_checkpoints: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (two_checkpoints / "pyproject.toml").write_text('[tool.memlayout]\nfail-on = "never"\n')
    seen: list[Any] = []
    real = memlayout.cli.options.settings_with_flags

    def spy(*args: Any, **kwargs: Any) -> Any:
        settings = real(*args, **kwargs)
        seen.append(settings.fail_on.value)
        return settings

    for module in ("memlayout.cli.inspect_command", "memlayout.cli.diff_command"):
        monkeypatch.setattr(f"{module}.settings_with_flags", spy)
    assert main(["diff", "a.pt", "b.pt"]) == 0  # the file's fail-on = never
    assert main(["diff", "a.pt", "b.pt", "--fail-on", "info"]) == 1  # the flag over it
    assert main(["inspect", "a.pt", "--fail-on", "error"]) == 0
    assert seen == ["never", "info", "error"]
