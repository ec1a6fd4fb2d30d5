"""The terminal report renders facts and findings as text, without printing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app
from memlayout.cli.formats import OutputFormat
from memlayout.report.table import render_table, storage_bar
from tests import models
from tests.report.rendering import render


def test_table_shows_summary_storages_and_findings_with_hints() -> None:
    text = render(memlayout.inspect(models.sliced_bloat_state()), OutputFormat.TABLE)
    assert "storage bytes" in text and "wasted bytes" in text and "unique bytes" in text
    assert "storages" in text and "s0" in text
    assert "ML301" in text and "storage-bloat" in text and "hint:" in text
    assert "\x1b[" not in text  # no color codes unless asked for


def test_table_color_is_opt_in() -> None:
    text = render(memlayout.inspect(models.sliced_bloat_state()), OutputFormat.TABLE, color=True)
    assert "\x1b[" in text


def test_table_says_when_there_is_nothing_to_report() -> None:
    assert "no findings" in render(memlayout.inspect(models.cloned_slice_state()), OutputFormat.TABLE)


def storage_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"│ s\d+ ", line)]


def test_more_than_50_storages_show_the_20_largest_and_say_how_many_are_folded() -> None:
    state = {f"t{i}": models.torch.randn(i + 1) for i in range(60)}
    text = render(memlayout.inspect(state), OutputFormat.TABLE, width=200)
    rows = storage_rows(text)
    assert len(rows) == 20
    assert [row.split("│")[3].strip() for row in rows[:2]] == ["240 B", "236 B"]  # largest first
    folded = sum(4 * (i + 1) for i in range(40))
    assert f"40 smaller storages folded ({folded / 1024:.1f} KiB); --all shows every storage" in text


def test_show_all_and_up_to_50_are_never_folded() -> None:
    many = memlayout.inspect({f"t{i}": models.torch.randn(4) for i in range(60)})
    assert len(storage_rows(render_table(many, width=200, show_all=True))) == 60
    fifty = memlayout.inspect({f"t{i}": models.torch.randn(4) for i in range(50)})
    text = render(fifty, OutputFormat.TABLE, width=200)
    assert len(storage_rows(text)) == 50 and "folded" not in text


def test_the_inspect_all_option_reaches_the_table(tmp_path: Path) -> None:
    path = tmp_path / "many.pt"
    models.torch.save({f"t{i}": models.torch.randn(4) for i in range(60)}, path)
    folded = CliRunner().invoke(app, ["inspect", str(path), "--fail-on", "never"])
    every = CliRunner().invoke(app, ["inspect", str(path), "--all", "--fail-on", "never"])
    assert folded.exit_code == every.exit_code == 0
    assert len(storage_rows(folded.stdout)) == 20 and len(storage_rows(every.stdout)) == 60


@pytest.mark.parametrize(
    ("used", "padding", "unused", "expected"),
    [
        (100, 0, 0, "\u2588" * 16),
        (50, 0, 50, "\u2588" * 8 + "\u2591" * 8),
        (1, 0, 10_000, "\u2588" + "\u2591" * 15),  # a tiny used part still gets a cell
        (10_000, 1, 1, "\u2588" * 14 + "\u2592" + "\u2591"),
        (60, 20, 20, "\u2588" * 10 + "\u2592" * 3 + "\u2591" * 3),
    ],
)
def test_storage_bar_shares_cells_by_bytes(used: int, padding: int, unused: int, expected: str) -> None:
    assert storage_bar(used, padding, unused).plain == expected


def test_bars_come_from_the_facts_of_bloat_and_padding() -> None:
    import torch

    bloated = memlayout.inspect({"w": torch.randn(1024)[:256]})  # a quarter of its storage used
    (row,) = storage_rows(render(bloated, OutputFormat.TABLE, width=200))
    assert "\u2588" * 4 + "\u2591" * 12 + " " in row
    flat = torch.zeros(64)  # two slots aligned to 64 bytes, with padding after the first
    padded = memlayout.inspect({"a": flat[:12], "b": flat[16:28]})
    storage = padded.facts.storages[0]
    assert storage.padding_bytes == 16 and storage.unused_bytes == 256 - 96 - 16
    (row,) = storage_rows(render(padded, OutputFormat.TABLE, width=200))
    assert "\u2592" in row and "\u2591" in row


def _transposed(count: int) -> dict[str, object]:
    return {f"w{i}": models.torch.randn(3, 2).t() for i in range(count)}


def test_past_50_findings_each_rule_lists_five_and_counts_the_rest() -> None:
    text = render(memlayout.inspect(_transposed(60)), OutputFormat.TABLE, width=200)
    assert text.count("ML201 warning") == 5
    assert "... and 55 more ML201 findings; --all lists every one" in text
    report = memlayout.inspect(_transposed(49))
    assert len(report.findings) == 50  # 49 ML201 and one ML204: the most that is never folded
    fifty = render(report, OutputFormat.TABLE, width=200)
    assert fifty.count("ML201 warning") == 49 and "more ML201" not in fifty


def test_the_inspect_all_option_lists_every_finding(tmp_path: Path) -> None:
    # Following the folded line's advice shows all of them.
    path = tmp_path / "transposed.pt"
    models.torch.save(_transposed(60), path)
    folded = CliRunner().invoke(app, ["inspect", str(path), "--fail-on", "never"])
    every = CliRunner().invoke(app, ["inspect", str(path), "--all", "--fail-on", "never"])
    assert "... and 55 more ML201 findings; --all lists every one" in folded.stdout
    assert every.stdout.count("ML201 warning") == 60 and "more ML201" not in every.stdout


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    """One tensor is "1 (1 name)", not "1 (1 names)"; two tied names are "(2 names)"."""
    import torch

    one = tmp_path / "one.pt"
    torch.save({"w": torch.zeros(4)}, one)
    output = CliRunner().invoke(app, ["inspect", str(one), "--fail-on", "never"]).output
    assert re.search(r"tensors\s+1 \(1 name\)", output), output
    tied = tmp_path / "tied.pt"
    weight = torch.zeros(4)
    torch.save({"a": weight, "b": weight}, tied)
    output = CliRunner().invoke(app, ["inspect", str(tied), "--fail-on", "never"]).output
    assert re.search(r"tensors\s+\d+ \(2 names\)", output), output


def test_a_tie_saved_as_one_tensor_shows_every_name_in_the_storage_table(tmp_path: Path) -> None:
    # Issue 26, defect 7: the summary said "1 (2 names)" while the table showed one.
    embed = torch.randn(4, 3)
    path = tmp_path / "tied.pt"
    torch.save({"embed.weight": embed, "head.weight": embed}, path)
    text = render_table(memlayout.inspect(str(path)), width=160)
    (row,) = [line for line in text.splitlines() if line.startswith("│ s0")]
    assert "embed.weight = head.weight" in row


@pytest.mark.parametrize("width", [80, 120])
def test_a_long_path_keeps_its_file_name_and_format_in_the_panel_title(tmp_path: Path, width: int) -> None:
    # rich crops a title at its right end: a deep folder's members would all read alike.
    folder = tmp_path.joinpath(*(["a-rather-long-folder-name"] * 6))
    folder.mkdir(parents=True)
    torch.save(models.cloned_slice_state(), folder / "pytorch_model-00001-of-00002.bin")
    text = render_table(memlayout.inspect(str(folder / "pytorch_model-00001-of-00002.bin")), width=width)
    title = text.splitlines()[0]
    assert len(title) <= width
    assert title.endswith("/pytorch_model-00001-of-00002.bin [torch-zip] ─╮"), title
    assert title.startswith("╭─ memlayout: …")
