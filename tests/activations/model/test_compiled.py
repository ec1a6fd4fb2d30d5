"""A model compiled with torch.compile: refused in one line, or with --eager its eager step traced."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from memlayout.activations import analyze
from memlayout.activations.ranks import analyze_ranks
from memlayout.cli.app import app
from tests.activations.sharded_models import BATCH_SPECS, llama_style

INPUTS = [a for spec in BATCH_SPECS for a in ("--input", spec)]


def compiled_blocks() -> torch.nn.Module:
    """torchtitan's `apply_compile`: each block replaced by its torch.compile'd module (nothing compiles until run)."""
    model = llama_style()
    for index, block in enumerate(model.layers):
        model.layers[index] = torch.compile(block, fullgraph=True)
    return model


def compiled_root() -> torch.nn.Module:
    return torch.compile(llama_style())


def test_a_compiled_model_is_refused_in_one_line_naming_what_eager_predicts() -> None:
    for target in ("compiled_blocks", "compiled_root"):
        result = CliRunner().invoke(app, ["activations", f"tests.activations.model.test_compiled:{target}", *INPUTS])
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1 and "compiled with torch.compile" in line and "--eager" in line


def test_eager_predicts_the_uncompiled_models_step_on_one_device_and_on_ranks() -> None:
    eager = analyze(compiled_blocks(), list(BATCH_SPECS), eager=True).summary.peak_bytes
    assert eager == analyze(llama_style(), list(BATCH_SPECS)).summary.peak_bytes
    ranks = analyze_ranks(compiled_root(), list(BATCH_SPECS), world_size=2, fsdp=True, eager=True)
    plain = analyze_ranks(llama_style(), list(BATCH_SPECS), world_size=2, fsdp=True)
    assert ranks.largest.peak_bytes == plain.largest.peak_bytes


def test_the_users_compiled_model_is_left_compiled() -> None:
    model = compiled_blocks()
    analyze(model, list(BATCH_SPECS), eager=True)
    assert type(model.layers[0]).__name__ == "OptimizedModule"
