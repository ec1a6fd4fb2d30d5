"""Checkpoints saved from CUDA inspect on a CPU-only machine and keep their device."""

from __future__ import annotations

from pathlib import Path

from memlayout.pipeline.inspection import run_inspection
from tests.load import malicious
from tests.load.conftest import pickle_with_locations, run_cli


def _write(tmp_path: Path, tensors: dict[str, tuple[int, str]]) -> Path:
    data_pkl, records = pickle_with_locations(tensors)
    path = tmp_path / "saved_on_gpu.pt"
    path.write_bytes(malicious.torch_zip(data_pkl, records))
    return path


def test_cuda_saved_checkpoint_reports_cuda_devices(tmp_path: Path) -> None:
    path = _write(tmp_path, {"w": (64, "cuda:0"), "b": (8, "cuda:0")})
    report = run_inspection(str(path))
    assert {t.device for t in report.facts.tensors} == {"cuda:0"}
    assert {s.device for s in report.facts.storages} == {"cuda:0"}
    assert "ML501" not in {f.code for f in report.findings}


def test_mixed_locations_are_ml501(tmp_path: Path) -> None:
    path = _write(tmp_path, {"a": (64, "cuda:0"), "b": (64, "cuda:0"), "c": (64, "cpu")})
    (finding,) = [f for f in run_inspection(str(path)).findings if f.code == "ML501"]
    assert finding.tensors == ("c",)


def test_cli_json_shows_the_cuda_device(tmp_path: Path) -> None:
    path = _write(tmp_path, {"w": (16, "cuda:1")})
    result = run_cli("inspect", str(path), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert '"cuda:1"' in result.stdout
