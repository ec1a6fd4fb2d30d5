"""`memlayout diff`'s formats on a diff built in memory: each renders the changes it is given."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app
from memlayout.cli.formats import (
    Command,
    OutputFormat,
    RenderOptions,
    formats_for,
    supported,
    to_format,
)
from memlayout.diff.changes import Change, ChangeKind, DiffReport
from memlayout.output.interface import Formatter
from memlayout.rules import Severity

SCHEMA = json.loads((Path(memlayout.__file__).parent / "diff" / "schema_v1.json").read_text())


def fake_diff() -> DiffReport:
    """Two inspected state dicts and three changes written by hand: no comparison runs."""
    a = memlayout.inspect({"w": torch.zeros(4, 4), "gone": torch.zeros(2)})
    b = memlayout.inspect({"w": torch.zeros(4, 4, dtype=torch.float16), "new": torch.zeros(3)})
    changes = (
        Change(ChangeKind.DTYPE, Severity.WARNING, ("w",), "w: dtype float32 -> float16", ("w",), ("w",),
               "float32", "float16"),
        Change(ChangeKind.REMOVED, Severity.WARNING, ("gone",), "gone: only in A", a_names=("gone",)),
        Change(ChangeKind.ADDED, Severity.INFO, ("new",), "new: only in B", b_names=("new",)),
    )
    return DiffReport(a, b, changes, matched=1)


def formatter(fmt: OutputFormat, color: bool = False) -> Formatter[DiffReport]:
    return supported(to_format(fmt).diff, fmt, Command.DIFF)(RenderOptions(color=color))


def test_diff_writes_table_json_markdown_and_html() -> None:
    assert formats_for(Command.DIFF) == (OutputFormat.TABLE, OutputFormat.JSON, OutputFormat.MARKDOWN,
                                         OutputFormat.HTML)


def test_json_lists_every_change_and_follows_its_schema() -> None:
    data = json.loads(formatter(OutputFormat.JSON).render(fake_diff()))
    jsonschema.validate(data, SCHEMA)
    assert [(c["kind"], c["severity"], c["tensors"]) for c in data["changes"]] == [
        ("dtype", "warning", ["w"]), ("removed", "warning", ["gone"]), ("added", "info", ["new"]),
    ]
    assert data["matched"] == 1


def test_table_and_markdown_show_the_counts_and_the_changes() -> None:
    table = formatter(OutputFormat.TABLE).render(fake_diff())
    assert "1 names matched; 0 error, 2 warning, 1 info" in table
    assert "warning dtype: w: dtype float32 -> float16" in table and "\x1b[" not in table
    assert "\x1b[" in formatter(OutputFormat.TABLE, color=True).render(fake_diff())
    markdown = formatter(OutputFormat.MARKDOWN).render(fake_diff())
    assert markdown.startswith("## memlayout diff")
    assert "| warning | dtype | w: dtype float32 -> float16 |" in markdown


def test_the_page_colours_each_side_and_lists_the_changes() -> None:
    page = formatter(OutputFormat.HTML).render(fake_diff())
    embedded = re.search(r'<script type="application/json" id="memlayout-data">(.*?)</script>', page, re.S)
    assert embedded is not None
    data = json.loads(embedded.group(1))
    marks = [{t[0][0]: t[-1] for t in side["tensors"]} for side in data["sides"]]
    assert marks == [{"w": "changed", "gone": "removed"}, {"w": "changed", "new": "added"}]
    assert [line[:2] for line in data["changes"]] == [["warning", "dtype"], ["warning", "removed"], ["info", "added"]]


@pytest.mark.parametrize("command", ["inspect", "diff"])
def test_format_html_is_the_page_html_writes(command: str, tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(4, 4).t()}, tmp_path / "a.pt")
    paths = [str(tmp_path / "a.pt")] * (1 if command == "inspect" else 2)
    page = tmp_path / "page.html"
    printed = CliRunner().invoke(app, [command, *paths, "--format", "html"])
    written = CliRunner().invoke(app, [command, *paths, "--html", str(page)])
    assert printed.exit_code == written.exit_code == (1 if command == "inspect" else 0)
    assert printed.stdout.startswith("<!doctype html>") and printed.stdout == page.read_text()
