"""Inspecting a file imports its own format's loader and no other: detection reads bytes, not loaders."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from memlayout.load import FORMATS

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "fixtures" / "demo_checkpoint.pt"  # torch.save's zip format
LEGACY = REPO / "fixtures" / "formats" / "legacy_state_dict.pt"
ZIP_READER = "memlayout.io.zip_archive"
LOADERS = sorted({fmt.module for fmt in FORMATS} | {ZIP_READER})


def _safetensors_file(path: Path) -> Path:
    # Written byte by byte as the format's spec lays it out: no safetensors import in the child.
    header = json.dumps({"weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    return path


def _loaders_imported(target: Path, cwd: Path) -> list[str]:
    child = (
        "import json, sys\n"
        "from memlayout.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        f"print(json.dumps({{'code': code, 'loaders': sorted(set({LOADERS!r}) & set(sys.modules))}}), "
        "file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, "inspect", str(target), "--format", "json", "--fail-on", "never"],
        capture_output=True, text=True, cwd=cwd, timeout=120,
    )
    result = json.loads(done.stderr.splitlines()[-1])
    assert result["code"] == 0, done.stderr
    loaders: list[str] = result["loaders"]
    return loaders


@pytest.mark.parametrize(
    ("name", "loader"),
    [
        ("safetensors", "memlayout.load.safetensors_file"),
        ("torch-zip", "memlayout.load.torch_zip"),  # and the zip reader, below
        ("legacy", "memlayout.load.legacy"),
    ],
)
def test_inspect_imports_only_the_loader_of_the_files_format(tmp_path: Path, name: str, loader: str) -> None:
    target = {"safetensors": lambda: _safetensors_file(tmp_path / "w.safetensors"), "torch-zip": lambda: DEMO,
              "legacy": lambda: LEGACY}[name]()
    expected = [ZIP_READER, loader] if name == "torch-zip" else [loader]
    assert _loaders_imported(target, tmp_path) == expected


def test_every_format_names_a_loader_function_and_confirm_that_exist() -> None:
    import importlib

    for fmt in FORMATS:
        module = importlib.import_module(fmt.module)
        assert callable(getattr(module, fmt.load)), fmt.name
        if fmt.confirm is not None:
            assert callable(getattr(module, fmt.confirm)), fmt.name
