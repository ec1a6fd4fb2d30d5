"""docs/activations-weights.md's `--weights` table is the last benchmark's results, the figures its prose quotes are
in it, and memlayout's figures there are what the command prints today."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.accuracy.weights_table import MARKER, RESULTS, table_markdown
from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "activations-weights.md").read_text()
RESULTS_DATA = json.loads(RESULTS.read_text())


def test_the_page_names_the_table_the_site_build_renders() -> None:
    from tests.test_docs import HOOKS

    assert MARKER in PAGE
    assert HOOKS.MARKERS[MARKER]() == table_markdown()
    assert not RESULTS_DATA["quick"] and set(RESULTS_DATA["raw"]) >= {"gpt2", "bert-base", "t5-small", "llama-7b"}


@pytest.mark.parametrize("quoted", ["24.61 GiB", "25.10 GiB", "0.35 GiB", "0.23 GiB"])
def test_the_figures_the_prose_quotes_are_the_tables(quoted: str) -> None:
    section = PAGE[PAGE.index("## A quick answer, before any batch"):]
    assert quoted in section and quoted in table_markdown()


def test_the_real_model_agrees_to_the_byte_where_it_was_built() -> None:
    for name, figures in RESULTS_DATA["raw"].items():
        real = figures.get("real")
        if real is None:
            continue
        training = figures["memlayout"]["dtypes"][0]["training"]
        assert training["total_bytes"] == real["weights_bytes"] + real["gradient_bytes"] + real["optimizer_bytes"], name
        assert figures["memlayout"]["parameters"]["count"] == real["parameters"], name


@pytest.mark.parametrize("name", sorted(RESULTS_DATA["raw"]))
def test_the_memlayout_figures_are_what_its_command_prints_today(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = RESULTS_DATA["raw"][name]["memlayout"]
    monkeypatch.chdir(ROOT)
    args = shlex.split(figures["command"])
    assert args[:2] == ["memlayout", "activations"]
    result = CliRunner().invoke(app, args[1:])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["dtypes"] == figures["dtypes"]
