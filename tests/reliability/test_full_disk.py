"""A full disk: one line, exit 2, IN untouched, no partial OUT, an old OUT kept.

The disk is a small tmpfs mounted for the test (root only; skipped with one line
where mounting is impossible).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from memlayout.cli.app import main

DEMO = str(Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[Path, int], Path]]:
    mounted: list[Path] = []

    def mount(where: Path, kib: int) -> Path:
        where.mkdir(exist_ok=True)
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or 'mount failed'}")
        mounted.append(where)
        return where

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def big_checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "in.pt"
    base = torch.randn(1024, 1024)  # 4 MiB, as two strided views: flatten rewrites it
    torch.save({"a": base[:, :512], "b": base[:, 512:].t()}, path)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("memlayout: error:"), error
    return error


def test_flatten_onto_a_full_disk_is_one_line_and_leaves_no_partial_out(
    tmp_path: Path, small_disk: Callable[[Path, int], Path], big_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    disk = small_disk(tmp_path / "disk", 1024)
    before = digest(big_checkpoint)
    assert main(["flatten", str(big_checkpoint), "-o", str(disk / "out.pt"), "--device", "cpu"]) == 2
    error = one_error_line(capsys)
    assert "no space left on device" in error.lower() and "unexpected" not in error
    assert digest(big_checkpoint) == before
    assert os.listdir(disk) == []


def test_a_full_disk_keeps_the_old_out(
    tmp_path: Path, small_disk: Callable[[Path, int], Path], big_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    disk = small_disk(tmp_path / "disk", 2048)
    old = disk / "out.pt"
    torch.save({"old": torch.arange(10)}, old)
    before = digest(old)
    assert main(["flatten", str(big_checkpoint), "-o", str(old), "--device", "cpu"]) == 2
    one_error_line(capsys)
    assert digest(old) == before
    assert os.listdir(disk) == ["out.pt"]


@pytest.mark.parametrize("where", ["the mount point", "a new folder on it"])
def test_a_folder_onto_a_full_disk_leaves_no_partial_folder(
    tmp_path: Path, small_disk: Callable[[Path, int], Path], capsys: pytest.CaptureFixture[str], where: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "toy"}))
    save_file({"w": torch.randn(1024, 1024)}, model / "model.safetensors")
    before = digest(model / "model.safetensors")
    disk = small_disk(tmp_path / "disk", 2048)
    # A container volume is a mount point: nothing can be renamed over it.
    out = disk if where == "the mount point" else disk / "out"
    assert main(["flatten", str(model), "-o", str(out), "--device", "cpu"]) == 2
    assert "no space left on device" in one_error_line(capsys).lower()
    assert digest(model / "model.safetensors") == before
    assert os.listdir(disk) == []


def test_a_report_onto_a_full_disk_is_one_line(
    tmp_path: Path, small_disk: Callable[[Path, int], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    disk = small_disk(tmp_path / "disk", 64)
    filler = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill it to the last block
        while os.write(filler, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(filler)
    assert main(["inspect", DEMO, "--format", "json", "-o", str(disk / "report.json")]) == 2
    assert "no space left on device" in one_error_line(capsys).lower()
    assert sorted(os.listdir(disk)) == ["filler"]


def test_a_model_folder_into_a_mount_point_with_room_is_written(
    tmp_path: Path, small_disk: Callable[[Path, int], Path]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "toy"}))
    save_file({"w": torch.randn(64, 64), "b": torch.randn(64)}, model / "model.safetensors")
    disk = small_disk(tmp_path / "disk", 4096)
    assert main(["flatten", str(model), "-o", str(disk), "--device", "cpu"]) == 0
    assert sorted(os.listdir(disk)) == ["config.json", "model.safetensors"]
