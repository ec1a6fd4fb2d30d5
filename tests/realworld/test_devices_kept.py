"""Checkpoints written on GPUs, flattened on this CPU-only machine, keep their devices (issue 21, item 4).

resemblyzer's legacy file (its LSTM in cuDNN's layout, some tensors on cpu), the
lpips weights and medaka's cuDNN-written GRUs name `cuda:0` in their persistent
ids. `memlayout flatten` with no `--device` must write the same locations, read
back by torch.load (`oracle.torch_view` records what each persistent id names),
with every value bitwise equal under `map_location="cpu"`, and the hints of the
findings flatten removes must work as printed, without `--device`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from memlayout.cli.app import main
from memlayout.flatten.apply import as_bits
from memlayout.pipeline.inspection import run_inspection
from tests.invariants import after_flatten_violations
from tests.realworld.expected import EXPECTED
from tests.realworld.oracle import torch_view

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")

CUDA_WRITTEN = [
    "resemblyzer", "lpips-v0.0-alex", "lpips-v0.0-squeeze", "lpips-v0.0-vgg", "lpips-v0.1-alex",
    "lpips-v0.1-squeeze", "lpips-v0.1-vgg", "medaka-hac-v6", "medaka-sup-v5.2",
]
# What flatten removes whatever the devices; ML501 (mixed devices) stays when they are kept.
FIXED_WITH_DEVICES_KEPT = {"ML201", "ML203", "ML204", "ML301", "ML401", "ML602"}


@pytest.fixture
def corpus_path(realworld: Callable[[str], Path]) -> Callable[[str], Path]:
    return realworld


@pytest.mark.parametrize("name", CUDA_WRITTEN)
def test_flatten_on_a_cpu_machine_keeps_every_device_the_file_records(
    name: str, corpus_path: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = corpus_path(name)
    fmt = EXPECTED[name].format
    before = torch_view(path, fmt)
    assert any(t.device.startswith("cuda") for t in before.values()), f"{name} records no CUDA device"
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(path), "-o", str(out)]) == 0
    summary = capsys.readouterr().out
    devices = sorted({t.device for t in before.values()})
    assert f"device    {', '.join(devices)} (kept:" in summary
    after = torch_view(out, "torch-zip")
    assert after.keys() == before.keys()
    for tensor_name, original in before.items():
        flat = after[tensor_name]
        assert flat.device == original.device, tensor_name
        assert (flat.dtype, flat.shape) == (original.dtype, original.shape), tensor_name
        assert original.tensor is not None and flat.tensor is not None
        assert torch.equal(as_bits(flat.tensor), as_bits(original.tensor)), tensor_name
    # Each device's tensors are flat: OUT is already flat as it stands, and the findings
    # whose hints say `memlayout flatten` are gone. A file on two devices stays on two (ML501).
    assert main(["flatten", str(out), "--check"]) == 0
    found_before = {f.code for f in run_inspection(str(path)).findings}
    found_after = {f.code for f in run_inspection(str(out)).findings}
    assert not found_after & FIXED_WITH_DEVICES_KEPT, found_after
    assert ("ML501" in found_after) == ("ML501" in found_before)
    # Checking the fix never fails: diff finds no regression, OUT wastes nothing (issue 26).
    reports = tmp_path / "after-flatten"
    reports.mkdir()
    assert after_flatten_violations(str(path), str(out), str(reports)) == []


@pytest.mark.parametrize("name", ["resemblyzer", "medaka-hac-v6"])
def test_device_cpu_still_moves_them_all(name: str, corpus_path: Callable[[str], Path], tmp_path: Path) -> None:
    path = corpus_path(name)
    out = tmp_path / "flat.pt"
    assert main(["flatten", str(path), "-o", str(out), "--device", "cpu"]) == 0
    assert {t.device for t in torch_view(out, "torch-zip").values()} == {"cpu"}
    assert "ML501" not in {f.code for f in run_inspection(str(out)).findings}
