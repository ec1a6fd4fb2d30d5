"""`inspect FOLDER` walks by content: every pickle, array and checkpoint is found whatever its name."""

from __future__ import annotations

import json
import os
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.load import HEAD_BYTES
from memlayout.pipeline import folder_walk
from memlayout.pipeline.folder_walk import folder_entries, folder_members


def _inspect(*args: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(app, ["inspect", *args, "--format", "json"])
    return result.exit_code, json.loads(result.stdout)


def _names(paths: list[str]) -> list[str]:
    return [Path(p).name for p in paths]


def test_files_are_chosen_by_content_not_by_name(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_bytes(pickle.dumps({"epoch": 3}))  # a pickle, whatever its name
    (tmp_path / "README.md").write_text("# a model\n")
    (tmp_path / "config.json").write_text('{"hidden": 4}')
    (tmp_path / "empty.cfg").write_bytes(b"")
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    with zipfile.ZipFile(tmp_path / "assets.zip", "w") as archive:  # a zip: its members are read
        archive.writestr("a.txt", "text")
    np.save(tmp_path / "table", np.zeros(3))  # .npy
    (tmp_path / "table.npy").rename(tmp_path / "table.dat")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "weights"))  # no suffix at all
    (tmp_path / "broken.pt").write_bytes(b"\x13junk")  # a checkpoint's name, no format: still reported
    (tmp_path / ".hidden.pkl").write_bytes(pickle.dumps(1))  # hidden files load as well as any other
    (tmp_path / "sub").mkdir()
    assert _names(folder_members(str(tmp_path))) == [
        ".hidden.pkl", "assets.zip", "broken.pt", "notes.txt", "sub", "table.dat", "weights",
    ]
    kinds = {Path(e.path).name: (e.kind, e.what) for e in folder_entries(str(tmp_path))}
    assert kinds == {
        ".hidden.pkl": ("read", ""), "assets.zip": ("read", ""), "broken.pt": ("expected", ""),
        "notes.txt": ("read", ""), "sub": ("folder", ""), "table.dat": ("read", ""), "weights": ("read", ""),
        "README.md": ("data", "text"), "config.json": ("data", "JSON text"), "empty.cfg": ("data", "an empty file"),
        "logo.png": ("data", "a PNG image"),
    }


def test_a_model_folders_other_files_are_inspected_beside_the_model(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    torch.save({"state": {}, "param_groups": []}, tmp_path / "optimizer.pt")
    (tmp_path / "training_args.bin").write_bytes(pickle.dumps({"lr": 0.1}))
    code, report = _inspect(str(tmp_path))
    paths = [Path(r["path"]).name for r in report["reports"]]  # type: ignore[index]
    assert paths == [tmp_path.name, "optimizer.pt", "training_args.bin"]
    formats = [r["report"]["source"]["format"] for r in report["reports"]]  # type: ignore[index]
    assert formats == ["hf-safetensors", "torch-zip", "pickle"]
    assert code == 0  # model.safetensors' ML203 is an info finding; the pickle of plain data is cleared
    assert report["summary"]["failed"] == 0  # type: ignore[index]


def test_a_model_folder_alone_keeps_the_one_path_report(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    _, report = _inspect(str(tmp_path))
    assert report["schema"] == 1


def test_a_dcp_folders_data_files_are_its_own(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.randn(4, 3)}, checkpoint_id=str(tmp_path))
    (tmp_path / "extra.pkl").write_bytes(pickle.dumps({"step": 1}))
    _, report = _inspect(str(tmp_path))
    paths = [Path(r["path"]).name for r in report["reports"]]  # type: ignore[index]
    assert paths == [tmp_path.name, "extra.pkl"]  # __0_0.distcp is read as part of the checkpoint


def test_a_walk_of_many_files_reads_only_the_first_bytes_of_each(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Functional, not timed (benchmarks/speed/bench_folder_walk.py times it): each file is
    # opened once and read once, HEAD_BYTES at most, however big it is.
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(10_000):
        (folder / f"item-{index:05d}.json").write_bytes(b'{"id": %d}' % index)
    with open(folder / "big.log", "wb") as big:
        big.truncate(64 << 20)  # 64 MiB of zeros, which a whole-file read would take
    (folder / "model.bin").write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    opened: list[str] = []
    asked: list[int] = []
    real_open, real_read = os.open, os.read

    def counting_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        opened.append(str(path))
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def counting_read(fd: int, length: int) -> bytes:
        asked.append(length)
        return real_read(fd, length)

    monkeypatch.setattr(folder_walk.os, "open", counting_open)
    monkeypatch.setattr(folder_walk.os, "read", counting_read)
    found = folder_members(str(folder))
    monkeypatch.undo()
    assert _names(found) == ["model.bin"]
    files = [name for name in opened if name != str(folder)]
    assert len(files) == len(set(files)) == 10_002  # each file opened once: none read again to recognize it
    assert len(asked) == 10_002 and max(asked) == HEAD_BYTES
