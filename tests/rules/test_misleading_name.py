"""ML604: a file whose name claims a format its content is not; names worn by several formats claim nothing."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from memlayout.load.names import claimed_formats
from memlayout.pipeline.inspection import run_inspection


def _codes(path: Path) -> set[str]:
    return {f.code for f in run_inspection(str(path)).findings}


def _torch_zip(path: Path) -> Path:
    torch.save({"w": torch.zeros(2)}, path)
    return path


def _pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps({"epoch": 3}))
    return path


@pytest.mark.parametrize(
    ("name", "write", "lies"),
    [
        ("model.safetensors", _torch_zip, True),  # issue 50's lying weights
        ("notes.txt", _pickle, True),  # a pickle an editor would open
        ("config.json", _pickle, True),
        ("logo.PNG", _pickle, True),  # the suffix's case does not matter
        ("embedding.npy", _torch_zip, True),
        ("archive.zip", _pickle, True),
        ("model.pt", _torch_zip, False),  # torch's own names claim no one format
        ("model.bin", _pickle, False),
        ("training_args.bin", _pickle, False),
        ("state.pkl", _pickle, False),
        ("checkpoint.pth.tar", _torch_zip, False),  # PyTorch's ImageNet example's name for a torch.save zip
        ("model.zip", _torch_zip, False),  # a torch.save zip is a zip
        ("weights", _torch_zip, False),  # no suffix, no claim
    ],
)
def test_a_name_that_claims_another_format_is_flagged(name: str, write: object, lies: bool, tmp_path: Path) -> None:
    path = write(tmp_path / name)  # type: ignore[operator]
    assert ("ML604" in _codes(path)) is lies


def test_files_that_are_what_their_names_say_are_not_flagged(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    np.save(tmp_path / "array.npy", np.zeros(3))
    (tmp_path / "state.pkl.gz").write_bytes(gzip.compress(pickle.dumps({"w": 1})))
    for path in (tmp_path / "model.safetensors", tmp_path / "array.npy", tmp_path / "state.pkl.gz"):
        assert "ML604" not in _codes(path), path


def test_a_folder_named_like_a_file_claims_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "weights.zip"
    folder.mkdir()
    save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    assert "ML604" not in _codes(folder)


def test_the_fingerprint_covers_what_the_name_claims_and_what_the_file_is(tmp_path: Path) -> None:
    (finding,) = [f for f in run_inspection(str(_torch_zip(tmp_path / "a.safetensors"))).findings if f.code == "ML604"]
    assert finding.subject == (".safetensors", "torch-zip")
    assert claimed_formats("dir/x.SafeTensors") == (".safetensors", ("safetensors",))
    assert claimed_formats("x.pth.tar") == (".pth.tar", ("torch-zip", "torch-legacy", "torch-legacy-tar", "tar"))
    assert claimed_formats("x.pt") is None
