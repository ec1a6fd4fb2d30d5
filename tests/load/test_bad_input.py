"""Damaged or foreign input: one stderr line, exit 2, no traceback, per format."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tests.load.conftest import assert_one_line_error, run_cli


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    assert_one_line_error(run_cli("inspect", str(path)), "empty")


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(b"\x13\x37" + os.urandom(4094))
    # The hint lists what memlayout does read, the legacy and export formats included.
    assert_one_line_error(run_cli("inspect", str(path)), "not a checkpoint format", "tar", ".pt2", "safetensors")


def test_truncated_torch_zip(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.randn(256, 256)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("inspect", str(path)))


def test_zip_that_is_no_checkpoint(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "docs.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    assert_one_line_error(run_cli("inspect", str(path)), "zip archive of text: no pickle or checkpoint inside")


def test_truncated_pickle(tmp_path: Path) -> None:
    path = tmp_path / "cut.pkl"
    path.write_bytes(b"\x80\x02}q\x00(X\x01\x00\x00\x00a")
    assert_one_line_error(run_cli("inspect", str(path)), "pickle could not be read")


def test_empty_directory(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("inspect", str(tmp_path)), "directory")
