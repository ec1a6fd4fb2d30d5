"""What memlayout says torch.load(weights_only=...) does, checked by calling torch.load.

Each test gets the message from the CLI as a user sees it (inspect's JSON, explain,
flatten's hint), then loads the same file with torch and asserts what the message
claims. ML601's message and hint are followed in test_hints_followed.py too; this
file holds the claims about torch's loader itself.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "formats"


def memlayout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memlayout", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def inspect_json(path: Path) -> dict[str, Any]:
    done = memlayout("inspect", str(path), "--format", "json", "--isolated", cwd=path.parent)
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_ml601_explain_says_torch_load_defaults_to_weights_only(tmp_path: Path) -> None:
    explained = memlayout("explain", "ML601", cwd=tmp_path)
    assert "`torch.load` defaults to `weights_only=True`" in " ".join(explained.stdout.split())
    path = tmp_path / "model.pt"
    torch.save(nn.Linear(4, 4), path)
    assert "ML601" in {f["code"] for f in inspect_json(path)["findings"]}
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)  # the default, no weights_only given
    assert isinstance(torch.load(path, weights_only=False), nn.Linear)  # "loading it needs weights_only=False"


def test_ml602_a_tar_file_loads_only_with_weights_only_false(tmp_path: Path) -> None:
    path = FIXTURES / "legacy_tar_state_dict.pt"
    (finding,) = [f for f in inspect_json(path)["findings"] if f["code"] == "ML602"]
    assert "which torch.load reads only with weights_only=False" in finding["message"]
    with pytest.raises(RuntimeError, match="weights_only"):
        torch.load(path, weights_only=True)
    state = torch.load(path, weights_only=False)
    assert all(isinstance(t, torch.Tensor) for t in state.values())


def test_a_non_zip_legacy_file_loads_weights_only(tmp_path: Path) -> None:
    # ML602 says nothing of weights_only for the pre-1.6 stream: torch reads it weights-only.
    path = FIXTURES / "legacy_state_dict.pt"
    (finding,) = [f for f in inspect_json(path)["findings"] if f["code"] == "ML602"]
    assert "weights_only" not in finding["message"]
    torch.load(path, weights_only=True)


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_torchscript_note_says_weights_only_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(nn.Linear(4, 4)), str(path))
    notes = inspect_json(path)["source"]["notes"]
    assert any("torch.load(weights_only=True) refuses it" in note for note in notes), notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "looks like a TorchScript archive" notice
        with pytest.raises(RuntimeError, match="weights_only=True"):
            torch.load(path, weights_only=True)
    assert torch.jit.load(str(path)) is not None


def test_flatten_hint_on_a_pickled_module_names_what_weights_only_refuses(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]), path)
    (finding,) = [f for f in inspect_json(path)["findings"] if f["code"] == "ML204"]
    named = re.search(r"its pickle names (.+?), outside torch's weights-only allow-list", finding["hint"])
    assert named and "`memlayout flatten --trust`" in finding["hint"], finding["hint"]
    refused = named.group(1).split(", ")
    with pytest.raises(pickle.UnpicklingError) as raised:
        torch.load(path, weights_only=True)
    assert any(name in str(raised.value) for name in refused), str(raised.value)

    # Without --trust flatten refuses in one line; with it, as the hint says, it works.
    refused_run = memlayout("flatten", str(path), "-o", "flat.pt", cwd=tmp_path)
    assert refused_run.returncode == 2 and len(refused_run.stderr.splitlines()) == 1, refused_run.stderr
    assert not (tmp_path / "flat.pt").exists()
    trusted = memlayout("flatten", "--trust", str(path), "-o", "flat.pt", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert "ML204" not in {f["code"] for f in inspect_json(tmp_path / "flat.pt")["findings"]}
