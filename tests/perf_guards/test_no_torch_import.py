"""Inspecting a file never imports torch: startup time is a feature for a pre-commit tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# The child runs the real CLI entry, then reports which heavy modules got imported.
_CHILD = """
import sys
from memlayout.cli.app import main
code = main(sys.argv[1:])
import json
sys.stderr.write(json.dumps({"code": code, "torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules}))
"""


def _inspect_in_child(*args: str, command: str = "inspect") -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, command, *args], capture_output=True, text=True, check=False
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, 1), result.stderr
    return report


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    base = torch.randn(64, 64)
    torch.save({"w": base, "w_t": base.t(), "copy": base.clone(), "b": torch.zeros(64)}, path)
    return path


@pytest.mark.parametrize("fmt", ["json", "table", "sarif", "github", "markdown", "junit"])
def test_inspecting_a_torch_save_file_never_imports_torch(checkpoint: Path, fmt: str) -> None:
    report = _inspect_in_child(str(checkpoint), "--format", fmt)
    assert report["torch"] is False


def test_deep_inspection_never_imports_torch(checkpoint: Path) -> None:
    report = _inspect_in_child(str(checkpoint), "--deep", "--format", "json")
    assert report["torch"] is False


def test_metadata_inspection_of_contiguous_tensors_never_imports_numpy(tmp_path: Path) -> None:
    # Byte sets of contiguous views and ML102's samples need no numpy; importing it
    # would cost more than the whole metadata inspection.
    path = tmp_path / "plain.pt"
    torch.save({f"layer{i}.weight": torch.randn(32, 32) for i in range(4)}, path)
    report = _inspect_in_child(str(path), "--format", "json")
    assert report["numpy"] is False


def test_the_pre_commit_hooks_never_import_torch(checkpoint: Path, tmp_path: Path) -> None:
    # What the two hooks of .pre-commit-hooks.yaml run, on several files at once.
    other = tmp_path / "other.pt"
    torch.save({"w": torch.randn(8, 8)}, other)
    assert _inspect_in_child(str(checkpoint), str(other))["torch"] is False
    assert _inspect_in_child(str(checkpoint), str(other), "--check", command="flatten")["torch"] is False
