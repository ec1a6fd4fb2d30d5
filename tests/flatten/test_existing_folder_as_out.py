"""`flatten FILE -o EXISTING_FOLDER` is a usage error whose hint, followed, works."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from memlayout.cli.app import main
from tests.flatten.models import LstmLM


def test_a_folder_as_out_for_one_file_says_which_file_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model.pt"
    torch.save(LstmLM().state_dict(), model)
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")

    assert main(["flatten", str(model), "-o", str(folder), "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("memlayout: error:") and error.count("\n") == 1
    assert "existing folder" in error and "Traceback" not in error
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]

    # Follow the hint: the -o it suggests is a file inside that folder.
    suggested = re.search(r"e\.g\. (-o .+)\)$", error.strip())
    assert suggested is not None
    command = ["flatten", str(model), *shlex.split(suggested.group(1)), "--device", "cpu"]
    assert main(command) == 0
    written = folder / "model.pt"
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt", "model.pt"]
    flat = torch.load(written, weights_only=True)
    original = torch.load(model, weights_only=True)
    assert flat.keys() == original.keys()
    assert all(torch.equal(flat[k], original[k]) for k in original)
