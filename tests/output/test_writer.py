"""The one writer of command output: stdout, or a file that is the old one or the whole new one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.diff.json_report import DiffJson
from memlayout.output.writer import write_output
from memlayout.report.html import HtmlReporter
from memlayout.report.json_report import JsonReporter

DEMO = str(Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt")


class FormatterBroke(RuntimeError):
    pass


def pieces_then_a_failure(*_: object) -> Iterator[str]:
    yield '{"schema": 1,\n'
    raise FormatterBroke("the formatter failed halfway")


def test_pieces_go_to_stdout_as_they_come(capsys: pytest.CaptureFixture[str]) -> None:
    write_output(iter(["one ", "two\n"]), None)
    write_output("three\n", None)
    assert capsys.readouterr().out == "one two\nthree\n"


def test_pieces_go_to_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.txt"
    write_output(iter(["one ", "two\n", "\u00e9\n"]), str(target))
    assert target.read_text(encoding="utf-8") == "one two\n\u00e9\n"


def test_a_formatter_failing_halfway_leaves_no_file_and_an_old_file_as_it_was(tmp_path: Path) -> None:
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("the previous report\n")
    for target in (new, old):
        with pytest.raises(FormatterBroke):
            write_output(pieces_then_a_failure(), str(target))
    assert not new.exists()
    assert old.read_text() == "the previous report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]  # no temporary left behind


@pytest.mark.parametrize(
    ("args", "formatter", "target"),
    [
        (["inspect", DEMO, "--format", "json", "-o"], JsonReporter, "report.json"),
        (["inspect", DEMO, "--html"], HtmlReporter, "map.html"),
        (["diff", DEMO, DEMO, "--format", "json", "-o"], DiffJson, "diff.json"),
    ],
)
def test_every_command_writes_its_file_through_the_one_writer(
    args: list[str], formatter: type, target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / target
    out.write_text("the previous output\n")
    monkeypatch.setattr(formatter, "render_pieces", pieces_then_a_failure)
    result = CliRunner().invoke(app, [*args, str(out)])
    assert result.exit_code == 2
    assert result.stderr.startswith("memlayout: error: unexpected FormatterBroke: the formatter failed halfway")
    assert out.read_text() == "the previous output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target]


def test_activations_writes_its_file_through_the_one_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memlayout.activations.report.json_report import ActivationsJson

    out = tmp_path / "activations.json"
    monkeypatch.setattr(ActivationsJson, "render_pieces", pieces_then_a_failure)
    result = CliRunner().invoke(app, ["activations", "tests.activations.models:flat_cnn", "--input",
                                      "float32[2,3,16,16]", "--format", "json", "-o", str(out)])
    assert result.exit_code == 2 and "the formatter failed halfway" in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
