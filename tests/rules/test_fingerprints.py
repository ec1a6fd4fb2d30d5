"""A finding's fingerprint changes when what it warns about changes, and only then (issue 50).

Each rule's fingerprint is the rule and its tensors, plus `Finding.subject` where
the tensors do not say it all. These follow what a user does between two runs of
a baseline: the same names, a different problem.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import Finding


def _finding(path: Path, code: str) -> Finding:
    (found,) = [f for f in run_inspection(str(path)).findings if f.code == code]
    return found


def test_ml401_of_a_state_dict_and_of_the_same_weights_copied_every_call_differ(tmp_path: Path) -> None:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4, num_layers=2)
    torch.save(lstm.state_dict(), tmp_path / "state.pt")  # loaded into a built module: no copy per call
    torch.save(lstm, tmp_path / "module.pt")  # torch.load keeps this layout: cuDNN copies every call
    noted, warned = _finding(tmp_path / "state.pt", "ML401"), _finding(tmp_path / "module.pt", "ML401")
    assert (noted.severity.value, warned.severity.value) == ("info", "warning")
    assert noted.tensors == warned.tensors and noted.fingerprint != warned.fingerprint
    assert noted.fingerprint == noted.fingerprint_v1  # a note's key is what it always was


def test_a_polyglot_valid_as_one_more_format_is_a_new_finding(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("notes.txt", "a zip after the pickles")
    finding = _finding(path, "ML603")
    assert finding.subject == ("zip",)
    assert finding.fingerprint != finding.fingerprint_v1


def test_rules_about_tensors_keep_their_keys(tmp_path: Path) -> None:
    base = torch.arange(64.0)
    torch.save({"w": base.reshape(8, 8).t()}, tmp_path / "t.pt")
    finding = _finding(tmp_path / "t.pt", "ML201")
    assert finding.subject == () and finding.fingerprint == finding.fingerprint_v1
