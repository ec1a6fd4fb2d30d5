"""A safetensors file is one mapped buffer: its facts, ML204, --check and flatten's summary say the same."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from memlayout.cli.app import main
from memlayout.pipeline.inspection import run_inspection


def _many_tensors(path: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(8, 8) for i in range(6)} | {f"layer{i}.bias": torch.randn(8) for i in range(6)}
    state["ids"] = torch.arange(10)
    save_file(state, path)
    return state


def _data_start(path: Path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def test_facts_see_one_storage_and_ml204_stays_quiet(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    _many_tensors(path)
    report = run_inspection(str(path))
    assert report.summary.storages == 1
    assert "ML204" not in {f.code for f in report.findings}


def test_flattened_output_is_flat_by_check_and_byte_identical_when_flattened_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, flat, again = tmp_path / "m.safetensors", tmp_path / "flat.safetensors", tmp_path / "again.safetensors"
    state = _many_tensors(path)
    assert main(["flatten", str(path), "-o", str(flat), "--device", "cpu"]) == 0
    summary = capsys.readouterr().out
    assert "storages  1 -> 1" in summary and "changed" in summary and "already flat" not in summary
    loaded = load_file(flat)
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    assert _data_start(flat) % 64 == 0
    assert "ML204" not in {f.code for f in run_inspection(str(flat)).findings}

    assert main(["flatten", str(flat), "--check"]) == 0
    assert "already flat (1 storage)" in capsys.readouterr().out
    assert main(["flatten", str(flat), "-o", str(again), "--device", "cpu"]) == 0
    assert "IN was already flat; OUT is a verified copy" in capsys.readouterr().out
    assert again.read_bytes() == flat.read_bytes()


def test_a_header_realigned_is_a_change_and_the_summary_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, flat, out = tmp_path / "m.safetensors", tmp_path / "flat.safetensors", tmp_path / "out.safetensors"
    _many_tensors(path)
    assert main(["flatten", str(path), "-o", str(flat), "--device", "cpu"]) == 0
    # The same tensors in the same order, with the header re-padded to 8 bytes only.
    raw = flat.read_bytes()
    header = json.loads(raw[8:_data_start(flat)])
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    if (8 + len(text)) % 64 == 0:
        text += b" " * 8
    shifted = tmp_path / "shifted.safetensors"
    shifted.write_bytes(struct.pack("<Q", len(text)) + text + raw[_data_start(flat):])
    assert _data_start(shifted) % 64 != 0
    capsys.readouterr()

    assert main(["flatten", str(shifted), "--check"]) == 1
    check = capsys.readouterr().out
    assert "data section starts at byte" in check and "tensors move" not in check
    assert main(["flatten", str(shifted), "-o", str(out), "--device", "cpu"]) == 0
    summary = capsys.readouterr().out
    assert "already flat" not in summary and "changed   the data section starts at byte" in summary
    assert _data_start(out) % 64 == 0
    assert out.read_bytes()[_data_start(out):] == raw[_data_start(flat):]
