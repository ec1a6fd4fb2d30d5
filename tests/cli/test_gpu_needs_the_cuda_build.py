"""`--gpu` needs torch's CUDA build, not a GPU: its help says so with the install command (issue 40).

The help said "no GPU is needed here" and nothing more, and a user on the CPU build
was refused every time. The help's command is the one the refusal gives, which
memlayout/activations/trace/world.py owns; the CLI keeps a copy so that `--help` never
loads the tracer, and this test holds the two equal.
"""

from __future__ import annotations

import re

import torch
from typer.testing import CliRunner

from memlayout.activations.trace.world import CUDA_WHEELS
from memlayout.cli.activations_options import CUDA_WHEELS as HELP_CUDA_WHEELS
from memlayout.cli.app import app

INSTALL = f"pip install torch --index-url {CUDA_WHEELS}"


def test_the_help_names_the_cuda_build_and_its_install_command() -> None:
    assert HELP_CUDA_WHEELS == CUDA_WHEELS
    shown = CliRunner().invoke(app, ["activations", "--help"], env={"COLUMNS": "2000"}).stdout
    gpu = " ".join(re.search(r"--gpu NAME(.*?)\n\s+--", shown, re.S)[1].split())  # type: ignore[index]
    assert "No GPU is needed here, but torch's CUDA build is" in gpu
    assert INSTALL in gpu


def test_on_this_torch_the_help_says_what_happens() -> None:
    result = CliRunner().invoke(
        app, ["activations", "fixtures.activation_models:cnn", "--input", "float32[2,3,32,32]", "--gpu", "t4"]
    )
    if torch.version.cuda is None:
        # The CPU build refuses it in one line, naming the command the help names.
        assert result.exit_code == 2 and INSTALL in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    else:
        # A CUDA build traces for the GPU without one.
        assert result.exit_code == 0, result.stderr
