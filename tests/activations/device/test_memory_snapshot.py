"""`--snapshot`: the predicted step as torch's memory snapshot, read by torch's own `_memory_viz` and replayed.

The replay is the one that checks the allocator model against a real H200 history
(allocator_history.py): it reads a snapshot as torch writes it, rebuilds the allocator's
state when recording began, and replays the events, placing each block where the model
would; here every block must land where the snapshot says, and the peaks must be the
report's.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import memlayout.activations as act
from memlayout.activations.device.allocator_replay import allocator_peaks
from memlayout.activations.device.memory_snapshot import STEP_FILE, memory_snapshot
from memlayout.activations.report.snapshot import snapshot_bytes
from memlayout.cli.app import app
from tests.activations.allocator_history import history, load_snapshot, replay_from_start

GPT2 = "tests.activations.models:gpt2"
INPUTS = ["int64[2,32]<500", "labels=int64[2,32]<500"]


@pytest.fixture(scope="module")
def step() -> act.ActivationReport:
    return act.analyze(GPT2, INPUTS)


@pytest.fixture(scope="module")
def snapshot_file(step: act.ActivationReport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snapshot") / "step.pickle"
    path.write_bytes(snapshot_bytes(step))
    return path


def live_peak(events: list[dict[str, Any]]) -> int:
    """The peak of the sizes requested and not yet freed: the live tensors'."""
    live = peak = 0
    for event in events:
        if event["action"] == "alloc":
            live += event["size"]
            peak = max(peak, live)
        elif event["action"] == "free_completed":
            live -= event["size"]
    return peak


def test_replaying_the_snapshot_gives_the_reports_peaks(step: act.ActivationReport, snapshot_file: Path) -> None:
    snapshot = pickle.loads(snapshot_file.read_bytes())
    replayed = replay_from_start(history(snapshot))
    assert replayed.misplaced == 0 and replayed.placements > 100  # every block where the snapshot has it
    predicted = allocator_peaks(step.trace)
    assert (replayed.peaks.allocated_bytes, replayed.peaks.reserved_bytes) == (predicted.allocated_bytes,
                                                                             predicted.reserved_bytes)
    (events,) = snapshot["device_traces"]
    assert live_peak(events) == step.summary.peak_bytes
    reserved = max(sum(e["size"] for e in events[: i + 1] if e["action"] == "segment_alloc")
                   for i in range(len(events)))
    assert reserved == predicted.reserved_bytes


def test_it_has_every_key_of_a_snapshot_cuda_recorded() -> None:
    real = load_snapshot()  # an H200's, torch 2.11
    ours = memory_snapshot(act.analyze(GPT2, INPUTS).trace)
    assert set(real) <= set(ours)
    assert set(real["segments"][0]) <= set(ours["segments"][0])
    assert set(real["segments"][0]["blocks"][0]) <= set(ours["segments"][0]["blocks"][0])
    assert set(real["device_traces"][0][0]) <= set(ours["device_traces"][0][0])


def test_each_event_names_the_module_and_the_phase(snapshot_file: Path) -> None:
    (events,) = pickle.loads(snapshot_file.read_bytes())["device_traces"]
    phases = {e["frames"][-1]["name"].partition(": ")[2] for e in events if e["action"] == "alloc"}
    assert {"setup", "forward", "backward", "optimizer"} <= phases  # GPT-2 computes its loss inside forward
    assert all(e["frames"][-1]["filename"] == STEP_FILE for e in events)
    modules = {frame["filename"] for e in events for frame in e["frames"][:-1]}
    assert {"transformer.h.0.attn", "transformer.h.1.mlp", "lm_head"} <= modules
    attention = next(e for e in events if e["action"] == "alloc" and e["frames"][0]["filename"] == "transformer.h.0.attn")
    assert [frame["filename"] for frame in attention["frames"][:3]] == ["transformer.h.0.attn", "transformer.h.0",
                                                                        "transformer"]
    assert attention["frames"][0]["name"] == "forward of GPT2Attention"


@pytest.mark.parametrize("command", [["stats"], ["trace"], ["trace_plot", "-o", "{out}.html"],
                                     ["trace_plot", "--segments", "-o", "{out}.html"],
                                     ["segment_plot", "-o", "{out}.html"]])
def test_torchs_memory_viz_reads_it(snapshot_file: Path, command: list[str], tmp_path: Path) -> None:
    out = tmp_path / "viz"
    argv = [part.replace("{out}", str(out)) for part in command]
    done = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", argv[0], str(snapshot_file), *argv[1:]],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    if argv[0] == "stats":
        assert "total_reserved" in done.stdout
    if argv[0] == "trace":
        assert "cudaMalloc" in done.stdout and "del " in done.stdout
    if "-o" in argv:
        assert out.with_suffix(".html").stat().st_size > 1000


def test_torchs_flamegraphs_of_it_account_for_every_byte(step: act.ActivationReport, snapshot_file: Path) -> None:
    from torch.cuda import _memory_viz

    snapshot = pickle.loads(snapshot_file.read_bytes())
    lines = _memory_viz.segments(snapshot, format_flamegraph=lambda text: text)  # flamegraph.pl is downloaded
    total = sum(int(line.rpartition(" ")[2]) for line in lines.splitlines() if line)
    assert total == sum(segment["total_size"] for segment in snapshot["segments"])
    memory = _memory_viz.memory(snapshot, format_flamegraph=lambda text: text)
    assert "forward of GPT2Attention" not in memory or "transformer.h.0.attn" in memory
    assert _memory_viz.segsum(snapshot).count("\n") > 3  # its own accounting holds (it asserts so)


def test_the_command_writes_the_snapshot_beside_the_report(tmp_path: Path) -> None:
    path = tmp_path / "step.pickle"
    result = CliRunner().invoke(app, ["activations", GPT2, *(f"--input={spec}" for spec in INPUTS),
                                      "--snapshot", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert pickle.loads(path.read_bytes())["device_traces"][0]


def test_a_snapshot_of_several_steps_is_refused_by_its_flag() -> None:
    result = CliRunner().invoke(app, ["activations", GPT2, *(f"--input={spec}" for spec in INPUTS),
                                      "--fit", "batch", "--budget", "1GiB", "--snapshot", "x.pickle"])
    assert result.exit_code == 2
    assert "--snapshot writes one step on one device, and --fit predicts several sizes" in result.stderr


@pytest.mark.cuda_build
def test_for_a_gpu_the_segments_give_the_reserved_peak() -> None:
    report = act.analyze(GPT2, INPUTS, gpu="h100")
    snapshot = pickle.loads(snapshot_bytes(report))
    replayed = replay_from_start(history(snapshot))
    assert replayed.misplaced == 0
    assert replayed.peaks.allocated_bytes == report.summary.allocator_peak_bytes
    assert replayed.peaks.reserved_bytes == report.summary.reserved_peak_bytes
    assert sum(segment["total_size"] for segment in snapshot["segments"]) == report.summary.reserved_peak_bytes
