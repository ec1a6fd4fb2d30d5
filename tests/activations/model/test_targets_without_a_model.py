"""`memlayout activations` on files that hold no model to build: each is named, in one line, with what to give instead.

issue 26, defect 5: every such file was told to "pass --trust", and following the
hint gave raw errors from torch.load (and torch's fake-tensor log lines on stderr).
The stderr checks run the CLI in a process of its own, where torch's loggers write.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from memlayout.cli.app import app

ROOT = Path(__file__).resolve().parents[3]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def _safetensors(path: Path) -> Path:
    from safetensors.torch import save_file

    save_file(dict(_model().state_dict()), path)
    return path


def _empty(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def _text(path: Path) -> Path:
    path.write_text("hello world\n")
    return path


def _state_dict(path: Path) -> Path:
    torch.save(_model().state_dict(), path)
    return path


def _checkpoint_holding_a_module(path: Path) -> Path:
    torch.save({"model": _model(), "step": 3}, path)
    return path


def _torchscript(path: Path) -> Path:
    torch.jit.save(torch.jit.script(_model()), str(path))
    return path


def _exported(path: Path) -> Path:
    torch.export.save(torch.export.export(_model(), (torch.randn(2, 4),)), str(path))
    return path


def _bare_pickle(path: Path) -> Path:
    with open(path, "wb") as handle:
        pickle.dump(_model(), handle)
    return path


def _dcp_directory(path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning):  # "torch.distributed is ... uninitialized": one process, as intended
        dcp.save({"weight": torch.zeros(3)}, checkpoint_id=str(path))
    return path


CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("model.safetensors", _safetensors, "is a safetensors file"),
    ("empty.pt", _empty, "is empty"),
    ("notes.txt", _text, "is not a checkpoint format memlayout recognizes"),
    ("state_dict.pt", _state_dict, "is a torch.save zip file whose top object is no nn.Module (a state dict"),
    ("checkpoint.pt", _checkpoint_holding_a_module, "whose nn.Module is under 'model'"),
    ("scripted.pt", _torchscript, "is a TorchScript archive"),
    ("exported.pt2", _exported, "is a torch.export program"),
    ("model.pkl", _bare_pickle, "is a bare pickle, not a torch.save file"),
    ("dcp", _dcp_directory, "is a torch.distributed.checkpoint directory"),
]


def _activations(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "memlayout", "activations", *args, "--input", "float32[2,4]"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )


@pytest.mark.parametrize("name, make, what", CASES, ids=[case[0] for case in CASES])
def test_a_file_without_a_model_is_named_in_one_line_with_or_without_trust(
    tmp_path: Path, name: str, make: Callable[[Path], Path], what: str
) -> None:
    path = make(tmp_path / name)
    # With --trust, in a process of its own: this is where torch.load ran and logged.
    done = _activations(str(path), "--trust")
    assert done.returncode == 2 and done.stdout == ""
    # Exactly one line: no torch log lines, warnings or traceback around it.
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"memlayout: error: {path} ") and what in done.stderr
    assert "pkg.module:build" in done.stderr and "config.json" in done.stderr
    # Without --trust, the same line: the file is never told to pass --trust.
    result = CliRunner().invoke(app, ["activations", str(path), "--input", "float32[2,4]"])
    assert result.exit_code == 2 and result.stderr == done.stderr
    assert "pass --trust" not in result.stderr


# The refusals state what torch does with these files; these tests ask torch.


def test_torch_load_returns_no_module_from_a_bare_pickle(tmp_path: Path) -> None:
    path = _bare_pickle(tmp_path / "model.pkl")
    with pytest.raises(RuntimeError, match="magic number"):
        torch.load(path, weights_only=False)


def test_torch_load_of_a_state_dict_returns_no_module(tmp_path: Path) -> None:
    loaded = torch.load(_state_dict(tmp_path / "sd.pt"), weights_only=False)
    assert isinstance(loaded, dict) and not isinstance(loaded, nn.Module)


def test_torchscript_cannot_be_loaded_onto_fake_tensors(tmp_path: Path) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    path = _torchscript(tmp_path / "scripted.pt")
    with FakeTensorMode(), pytest.raises(RuntimeError):
        torch.jit.load(str(path), map_location="cpu")
