"""Names from a file print as written in every terminal report: no markup, no emoji.

rich reads "[bold]" as a style, "[/bold]" with nothing open as an error, and
":smile:" as an emoji. A tensor, module or shard name is whatever the file's
writer chose, so each terminal report is run on names made of exactly those.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app
from memlayout.cli.formats import Command, OutputFormat, RenderOptions, supported, to_format
from memlayout.rules import RuleConfig
from tests.activations.report.test_formats import fake_report, module
from tests.report.rendering import render

NAMES = ("stray[/bold]", "[red]styled[/red]", "wink:smile:", "[link=https://example.com]here")


def write_weights(path: Path, extra: str | None = None) -> None:
    weights = {name: torch.zeros(4) for name in NAMES}
    if extra is not None:
        weights[extra] = torch.zeros(2)
    save_file(weights, str(path))


# The storage table folds a storage's names past three; ML203 at an alignment the project asks
# for (safetensors' own 8 bytes draw none) names every tensor, so each name is printed once at least.
ASKED = RuleConfig(alignment=64)


def test_inspect_table_prints_every_name_as_the_file_spells_it(tmp_path: Path) -> None:
    path = tmp_path / "names.safetensors"
    write_weights(path)
    result = CliRunner().invoke(
        app, ["inspect", str(path), "--format", "table", "--align", "64"], terminal_width=200
    )
    assert result.exit_code in (0, 1), result.output
    for name in NAMES:
        assert name in result.output


def test_the_colored_table_prints_every_name_as_the_file_spells_it(tmp_path: Path) -> None:
    path = tmp_path / "names.safetensors"
    write_weights(path)
    text = render(memlayout.inspect(path, config=ASKED), OutputFormat.TABLE, width=200, color=True)
    assert "\x1b[" in text
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    for name in NAMES:
        assert name in plain


def test_diff_table_prints_every_name_as_the_file_spells_it(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    write_weights(a)
    write_weights(b, extra="added[/dim]:tada:")
    result = CliRunner().invoke(app, ["diff", str(a), str(b)], terminal_width=200)
    assert result.exit_code in (0, 1), result.output
    assert "added[/dim]:tada:" in result.output


def test_activations_table_prints_a_module_name_as_the_model_spells_it() -> None:
    report = fake_report(with_plan=True)
    report = dataclasses.replace(
        report, modules=(*report.modules, module("blocks.[/bold]:smile:", "Block", 1 << 20))
    )
    formatter = supported(
        to_format(OutputFormat.TABLE).activations, OutputFormat.TABLE, Command.ACTIVATIONS
    )
    text = formatter(RenderOptions(width=200)).render(report)
    assert "blocks.[/bold]:smile:" in text
