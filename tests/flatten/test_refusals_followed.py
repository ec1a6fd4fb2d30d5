"""Where flatten refuses, the fix its one line names works when followed."""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path

import pytest
import torch

import memlayout
from memlayout.cli.app import main
from tests.flatten.sources import bare_pickle, model_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("memlayout: error:") and error.count("\n") == 1
    return error


class Tagger(torch.nn.Module):
    """An embedding, a 2-layer LSTM and a head: several storages and an RNN."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.lstm = torch.nn.LSTM(8, 8, num_layers=2)
        self.head = torch.nn.Linear(8, 4)


def test_dcp_refusal_names_the_fix_and_the_fix_keeps_the_flat_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    trained = Tagger()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(trained.state_dict(), checkpoint_id=str(tmp_path / "ckpt"))
    error = _refusal(["flatten", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")], capsys)
    assert "memlayout.flatten(model)" in error and "dcp.load(model.state_dict()" in error

    # Follow it: flatten the model, then load the checkpoint into its state dict.
    model = Tagger()
    memlayout.flatten(model)
    state = model.state_dict()
    layout = {name: (t.untyped_storage().data_ptr(), t.storage_offset()) for name, t in state.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))
    after = model.state_dict()
    assert {name: (t.untyped_storage().data_ptr(), t.storage_offset()) for name, t in after.items()} == layout
    assert all(torch.equal(after[name], value) for name, value in trained.state_dict().items())
    assert len({ptr for ptr, _ in layout.values()}) < len(layout)
    assert "ML401" not in {f.code for f in memlayout.inspect(model).findings}


def test_bare_pickle_refusal_names_the_fix_and_the_fix_flattens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = bare_pickle(tmp_path)
    error = _refusal(["flatten", str(source), "-o", str(tmp_path / "out.pt")], capsys)
    assert re.search(r"load it .*torch\.save the object, then flatten that file", error)

    # Follow it: load (this test wrote the file), torch.save, flatten the result.
    with open(source, "rb") as stream:
        loaded = pickle.load(stream)
    saved = tmp_path / "saved.pt"
    torch.save(loaded, saved)
    assert main(["flatten", str(saved), "-o", str(tmp_path / "flat.pt"), "--device", "cpu"]) == 0
    flat = torch.load(tmp_path / "flat.pt", weights_only=True)
    original = model_state()
    assert flat.keys() == original.keys() and all(torch.equal(flat[k], original[k]) for k in original)
