"""docs/evidence-fit.md's anchors tables are the last benchmark's results (benchmarks/results/anchors.json), the
figures its prose quotes are in them, and the figures there are what each tool and formula gives today."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.accuracy.anchors_table import MARKER, RESULTS, table_markdown
from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "evidence-fit.md").read_text()
RESULTS_DATA = json.loads(RESULTS.read_text())
RAW = RESULTS_DATA["raw"]
SECTION = PAGE[PAGE.index("## The anchors, side by side"):]


def _config(name: str) -> dict[str, object]:
    return json.loads((ROOT / "benchmarks" / "configs" / name / "config.json").read_text())


def test_the_page_names_the_tables_the_site_build_renders() -> None:
    from tests.test_docs import HOOKS

    assert MARKER in SECTION
    assert HOOKS.MARKERS[MARKER]() == table_markdown()
    assert not RESULTS_DATA["quick"]
    assert set(RAW["training"]) == {"gpt2", "bert-base", "t5-small", "llama-7b"}
    assert set(RAW["generation"]) == {"gpt2", "t5-small", "llama-1.1b", "llama-7b"}


@pytest.mark.parametrize("quoted", ["2,299,818,584", "2,299,818,592", "KeyError: 'hidden_size'", "125.513 GiB",
                                    "11,722,752", "3,932,160", "7,163,904", "159.00 MiB",
                                    "101.387 GiB"])
def test_the_figures_the_prose_quotes_are_the_results(quoted: str) -> None:
    assert quoted in SECTION
    assert quoted in table_markdown() or quoted in _numbers()


def _numbers() -> str:
    """Every whole number of the results, as the prose writes one."""
    return " ".join(f"{value:,}" for value in _ints(RAW))


def _ints(value: object) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [n for item in value.values() for n in _ints(item)]
    if isinstance(value, list):
        return [n for item in value for n in _ints(item)]
    return []


def test_memlayout_is_within_two_percent_of_each_real_step() -> None:
    for name, figures in RAW["training"].items():
        if "real" in figures:
            assert abs(figures["memlayout"]["peak_bytes"] / figures["real"]["peak_bytes"] - 1) <= 0.02, name


def test_deepspeed_counted_the_parameters_memlayout_counts() -> None:
    """DeepSpeed's model_to_params counts a tied weight once (by data_ptr), as memlayout does; its ZeRO-2 figure on
    one GPU is then 2 + 18 bytes a parameter."""
    for name, figures in RAW["training"].items():
        count = figures["memlayout"]["parameters"]
        assert figures["deepspeed"]["total_params"] == count, name
        assert figures["deepspeed"]["per_gpu_bytes"] == 20 * count, name


@pytest.mark.parametrize("name", sorted(RAW["generation"]))
def test_the_textbook_figures_are_what_it_gives_today(name: str) -> None:
    from benchmarks.accuracy.bench_anchors import textbook_cache

    assert textbook_cache(_config(name)) == RAW["generation"][name]["textbook"]


@pytest.mark.parametrize("name", sorted(RAW["generation"]))
def test_hf_mems_figures_are_what_it_gives_today(name: str) -> None:
    # hf-mem is in the bench extra, which `make venv` installs and the torch matrix's venvs do not.
    pytest.importorskip("hf_mem", reason="hf-mem is in memlayout's bench extra (make venv installs it)")
    from benchmarks.accuracy.bench_anchors import hf_mem_cache

    assert hf_mem_cache(_config(name)) == RAW["generation"][name]["hf_mem"]


def test_the_real_cache_holds_one_position_fewer_than_the_formula_counts() -> None:
    """The last token generate returns is never fed back, so its keys and values are never made; T5's decoder
    holds its 32 positions and the prompt's 128 (cross-attention), which the formula's 160 meets by their sum."""
    for name in ("gpt2", "llama-1.1b"):
        figures = RAW["generation"][name]
        tokens = figures["textbook"]["tokens"]
        assert figures["real"]["positions"] == [tokens - 1], name
        assert figures["real"]["cache_bytes"] * tokens == figures["textbook"]["cache_bytes"] * (tokens - 1), name
    t5 = RAW["generation"]["t5-small"]
    assert t5["real"]["positions"] == [32, 128] and t5["real"]["cache_bytes"] == t5["textbook"]["cache_bytes"]


@pytest.mark.parametrize("name", sorted(RAW["training"]))
def test_memlayout_weights_figure_is_what_the_command_prints_today(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = RAW["training"][name]["memlayout"]
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, [*shlex.split(figures["weights_command"])[1:], "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["dtypes"][0]["training"]["total_bytes"] == figures["model_states_bytes"]


def test_memlayout_step_figure_is_what_the_command_prints_today(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = RAW["training"]["gpt2"]["memlayout"]
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, [*shlex.split(figures["command"])[1:], "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["summary"]["peak_bytes"] == figures["peak_bytes"]


def test_memlayouts_cache_is_the_real_cache_on_every_model_generated_for_real() -> None:
    generated = [name for name, figures in RAW["generation"].items() if "real" in figures]
    assert len(generated) == 3
    for name in generated:
        figures = RAW["generation"][name]
        assert figures["memlayout"]["cache_bytes"] == figures["real"]["cache_bytes"], name


def test_memlayout_generate_figures_are_what_the_command_prints_today(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = RAW["generation"]["gpt2"]["memlayout"]
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, [*shlex.split(figures["command"])[1:], "--format", "json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["generate"]["cache_bytes"], report["summary"]["peak_bytes"]) == (
        figures["cache_bytes"], figures["peak_bytes"])
