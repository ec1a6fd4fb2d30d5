"""docs/activations-ranks.md's DDP figures are the last full run of benchmarks/accuracy/bench_ddp.py, and its command
prints them."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.accuracy.bench_ddp import CASES, fit_markdown, table_markdown
from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
PAGE = (ROOT / "docs" / "activations-ranks.md").read_text()
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "ddp.json").read_text())
SECTION = PAGE[PAGE.index("## Many GPUs: DDP ranks"):PAGE.index("## Inspecting a model that is already sharded")]


def test_the_page_quotes_the_results_file() -> None:
    assert not RESULTS["quick"]
    assert table_markdown(RESULTS) in SECTION
    assert fit_markdown(RESULTS) in SECTION.replace("\n", " ")
    # Every case of the benchmark is in the table, with each view of the gradients.
    assert len(re.findall(r"^\| .* \| (?:on|off) \|", SECTION, re.M)) == 2 * len(CASES) == len(RESULTS["raw"]["cases"])


def test_every_rank_the_page_shows_is_within_2_percent_and_the_fit_holds() -> None:
    for figures in RESULTS["raw"]["cases"].values():
        for measured in figures["real"]:
            assert abs(figures["predicted"] - measured) <= 0.02 * measured, figures
        assert figures["buckets"] == figures["real_buckets"], figures
    fit = RESULTS["raw"]["fit"]
    budget = int(re.search(r"--budget (\d+)", fit["command"])[1])  # type: ignore[index]
    assert fit["real"] <= budget < fit["real_next"]


def test_the_pages_command_prints_the_figure_its_table_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    (shown,) = re.findall(r"^\$ (memlayout activations .*?)\n```", SECTION, re.M | re.S)
    args = shlex.split(shown.replace("\\\n", " "))
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, [*args[1:], "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    case = next(key for key, case in CASES.items() if case.command(False) == args)
    assert report["summary"]["peak_bytes"] == RESULTS["raw"]["cases"][f"{case}-beside"]["predicted"]
