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
    state = ({f"layer{i}.weight": torch.randn(8, 8) for i in range(6)}
             | {f"layer{i}.bias": torch.randn(8) for i in range(6)})
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


def test_a_file_as_safetensors_writes_it_is_flat_and_copied_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # save_file starts the data section on 8 bytes and stores the largest elements first:
    # every tensor on a multiple of its element size, the format's own standard.
    path, out = tmp_path / "m.safetensors", tmp_path / "out.safetensors"
    _many_tensors(path)
    assert _data_start(path) % 8 == 0
    assert main(["flatten", str(path), "--check"]) == 0
    assert capsys.readouterr().out == f"{path}: already flat (1 storage)\n"
    assert "ML203" not in {f.code for f in run_inspection(str(path)).findings}
    assert main(["flatten", str(path), "-o", str(out), "--device", "cpu"]) == 0
    assert "IN was already flat; OUT is a verified copy" in capsys.readouterr().out
    assert out.read_bytes() == path.read_bytes()


def test_flattened_with_align_is_flat_by_check_and_byte_identical_when_flattened_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, flat, again = tmp_path / "m.safetensors", tmp_path / "flat.safetensors", tmp_path / "again.safetensors"
    state = _many_tensors(path)
    if _data_start(path) % 64 == 0:
        pytest.skip("save_file happened to start the data section on 64 bytes")
    assert main(["flatten", str(path), "--check", "--align", "64"]) == 1
    check = capsys.readouterr().out
    assert "ML203 info misaligned" in check and "64-byte boundary (as --align asks)" in check
    assert main(["flatten", str(path), "-o", str(flat), "--device", "cpu", "--align", "64"]) == 0
    summary = capsys.readouterr().out
    assert "storages  1 -> 1" in summary and "changed" in summary and "already flat" not in summary
    loaded = load_file(flat)
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    assert _data_start(flat) % 64 == 0
    assert "ML204" not in {f.code for f in run_inspection(str(flat)).findings}

    assert main(["flatten", str(flat), "--check", "--align", "64"]) == 0
    assert "already flat (1 storage)" in capsys.readouterr().out
    assert main(["flatten", str(flat), "-o", str(again), "--device", "cpu", "--align", "64"]) == 0
    assert "IN was already flat; OUT is a verified copy" in capsys.readouterr().out
    assert again.read_bytes() == flat.read_bytes()


def test_a_header_realigned_is_a_change_and_the_summary_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, flat, out = tmp_path / "m.safetensors", tmp_path / "flat.safetensors", tmp_path / "out.safetensors"
    _many_tensors(path)
    assert main(["flatten", str(path), "-o", str(flat), "--device", "cpu", "--align", "64"]) == 0
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

    # On 8 bytes, as safetensors' own writer puts it: flat, unless 64 is asked for.
    assert main(["flatten", str(shifted), "--check"]) == 0
    assert "already flat" in capsys.readouterr().out
    assert main(["flatten", str(shifted), "--check", "--align", "64"]) == 1
    check = capsys.readouterr().out
    assert "data section starts at byte" in check and "tensors move" not in check
    assert main(["flatten", str(shifted), "-o", str(out), "--device", "cpu", "--align", "64"]) == 0
    summary = capsys.readouterr().out
    assert "already flat" not in summary and "changed   the data section starts at byte" in summary
    assert _data_start(out) % 64 == 0
    assert out.read_bytes()[_data_start(out):] == raw[_data_start(flat):]


def test_an_odd_header_misaligns_every_tensor_and_flatten_lays_it_out_as_safetensors_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A writer that does not pad its header (huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B,
    # discussion 18) puts every tensor at an odd offset, and safe_open hands each out there.
    state = {"b": torch.randn(8), "w": torch.randn(16, 8)}
    entries = {"b": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]},
               "w": {"dtype": "F32", "shape": [16, 8], "data_offsets": [32, 544]}}
    text = json.dumps(entries).encode()
    text += b" " * ((9 - len(text)) % 2)  # an odd data start: 8 + an odd header length
    path, out = tmp_path / "odd.safetensors", tmp_path / "out.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + state["b"].numpy().tobytes() + state["w"].numpy().tobytes())
    assert _data_start(path) % 2 == 1
    assert all(t.data_ptr() % 4 for t in load_file(path).values())
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML203"]
    assert set(finding.tensors) == {"b", "w"} and "multiple of their element size" in finding.message

    # ML203 is info: below the default --fail-on, so the check passes, and says what flatten would still do.
    assert main(["flatten", str(path), "--check"]) == 0
    line = capsys.readouterr().out
    assert "passes (safetensors); flatten would still rewrite it: the data section starts at byte" in line
    assert "for ML203 misaligned (info, below --fail-on warning)" in line
    assert main(["flatten", str(path), "--check", "--fail-on", "info"]) == 1
    capsys.readouterr()
    # Following the finding's hint.
    assert "run `memlayout flatten`" in finding.hint
    assert main(["flatten", str(path), "-o", str(out), "--device", "cpu"]) == 0
    capsys.readouterr()
    loaded = load_file(out)
    assert all(t.data_ptr() % 4 == 0 and torch.equal(t, state[name]) for name, t in loaded.items())
    assert "ML203" not in {f.code for f in run_inspection(str(out)).findings}
    assert main(["flatten", str(out), "--check", "--fail-on", "info"]) == 0
