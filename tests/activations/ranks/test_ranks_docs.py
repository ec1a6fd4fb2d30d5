"""docs/evidence-fit.md: its table is the last benchmark's results, and the figures it shows come from the commands
it prints."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.accuracy.will_it_fit import MARKER, RESULTS, table_markdown
from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
RESULTS_DATA = json.loads(RESULTS.read_text())
SMALL = [key for key, figures in RESULTS_DATA.items() if figures["case"]["real"]]


def test_the_page_names_the_table_the_site_build_renders() -> None:
    from tests.test_docs import HOOKS

    assert MARKER in (ROOT / "docs" / "evidence-fit.md").read_text()
    assert HOOKS.MARKERS[MARKER]() == table_markdown()


def test_the_table_has_every_model_with_each_tools_figure_and_its_command() -> None:
    table = table_markdown(RESULTS_DATA)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert len(rows) == len(RESULTS_DATA) and len(RESULTS_DATA) >= 3
    for figures in RESULTS_DATA.values():
        assert figures["memlayout_command"] in table
        for tool in ("fsdpmemtracker", "accelerate", "deepspeed"):
            assert figures[tool]["command"] in table
    assert any(figures["case"]["world_size"] == 64 for figures in RESULTS_DATA.values())
    assert "does not fit this machine" in table and SMALL


@pytest.mark.parametrize("key", SMALL)
def test_the_memlayout_figure_is_what_its_command_prints_today(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = RESULTS_DATA[key]
    monkeypatch.chdir(ROOT)
    args = shlex.split(figures["memlayout_command"])
    assert args[0] == "memlayout"
    result = CliRunner().invoke(app, [*args[1:], "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["peak_bytes"] for r in report["ranks"]] == [r["peak_bytes"] for r in figures["memlayout"]["ranks"]]
    # and the real ranks the benchmark ran agree with it within 2%
    for rank, measured in figures["real"]["ranks"].items():
        predicted = next(r["peak_bytes"] for r in report["ranks"]
                         if r["same_layout"][0][0] <= int(rank) <= r["same_layout"][-1][1])
        assert abs(predicted - measured) <= 0.02 * measured
