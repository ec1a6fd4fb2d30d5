"""One small source of every format `memlayout inspect` reads, written by its real writer.

Each builder takes a folder and returns the path it wrote. The model behind them
has an LSTM, a tie and a non-contiguous weight, so that flatten always has
something to change.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from fixtures.make_format_fixtures import legacy_tar_bytes, tar_module
from tests.flatten.models import LstmLM


class ScriptableLstm(nn.Module):
    """An embedding, a 2-layer LSTM, a head and a buffer, scriptable and exportable."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, num_layers=2)
        self.head = nn.Linear(8, 20)
        self.register_buffer("scale", torch.ones(20))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden) * self.scale


def model_state() -> dict[str, torch.Tensor]:
    """LstmLM's state dict, with a transposed (non-contiguous) projection added."""
    torch.manual_seed(0)
    state = dict(LstmLM().state_dict())
    state["proj.weight"] = torch.randn(16, 8).t()
    return state


def torch_zip_state(folder: Path) -> Path:
    path = folder / "state.pt"
    torch.save(model_state(), path)
    return path


def torch_zip_module(folder: Path) -> Path:
    path = folder / "module.pt"
    torch.manual_seed(0)
    torch.save(LstmLM(), path)
    return path


def legacy_state(folder: Path) -> Path:
    path = folder / "legacy.pt"
    torch.save(model_state(), path, _use_new_zipfile_serialization=False)
    return path


def legacy_module(folder: Path) -> Path:
    path = folder / "legacy_module.pt"
    torch.manual_seed(0)
    torch.save(LstmLM(), path, _use_new_zipfile_serialization=False)
    return path


def legacy_tar_state(folder: Path) -> Path:
    path = folder / "legacy_tar.pt"
    path.write_bytes(legacy_tar_bytes(model_state()))
    return path


def legacy_tar_pickled_module(folder: Path) -> Path:
    path = folder / "legacy_tar_module.pt"
    path.write_bytes(legacy_tar_bytes(tar_module()))
    return path


def torchscript(folder: Path) -> Path:
    path = folder / "scripted.pt"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(ScriptableLstm()), str(path))
    return path


def torch_export(folder: Path) -> Path:
    path = folder / "exported.pt2"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(ScriptableLstm(), (torch.zeros(3, 2, dtype=torch.long),))
        torch.export.save(program, path)
    return path


def dcp_dir(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    path = folder / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(model_state(), checkpoint_id=str(path))
    return path


def bare_pickle(folder: Path) -> Path:
    path = folder / "plain.pkl"
    with open(path, "wb") as out:
        pickle.dump(model_state(), out)
    return path


def safetensors_file(folder: Path) -> Path:
    path = folder / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model_state().items() if k != "head.weight"}, path)
    return path


def hf_dir(folder: Path) -> Path:
    path = folder / "hf"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "toy"}))
    save_file({k: v.contiguous() for k, v in model_state().items() if k != "head.weight"}, path / "model.safetensors")
    return path


def hf_dir_bin(folder: Path) -> Path:
    path = folder / "hf_bin"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "toy"}))
    torch.save(model_state(), path / "pytorch_model.bin")
    return path


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "torch-zip state dict": torch_zip_state,
    "torch-zip module": torch_zip_module,
    "legacy state dict": legacy_state,
    "legacy module": legacy_module,
    "tar state dict": legacy_tar_state,
    "tar module": legacy_tar_pickled_module,
    "torchscript": torchscript,
    "torch.export": torch_export,
    "dcp": dcp_dir,
    "bare pickle": bare_pickle,
    "safetensors": safetensors_file,
    "hf safetensors": hf_dir,
    "hf bin": hf_dir_bin,
}
"""Every source kind, by a readable id."""
