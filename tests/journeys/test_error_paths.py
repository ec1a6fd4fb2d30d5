"""Every error path of every command, as a user meets it: exit 2, one line on stderr.

Each command of the typer app (`memlayout.cli.app.COMMANDS`) is run in its own
process on a file of the wrong format for it, an empty file, a directory and a
missing path. The process is real because torch's C++ logging (`E1126 12:00:00
... fake_tensor.py:...]` lines) writes to file descriptor 2, which an in-process
runner never sees. Nothing may be written: not the `-o` output, not anything
beside the input.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from memlayout.cli.app import COMMANDS

TORCH_LOG_LINE = re.compile(r"^[EWIF]\d{4} \d\d:\d\d:\d\d")
"""The prefix glog and torch's C++/Python structured logging put on a line: E1126 00:28:32.255000."""

INPUTS = ("wrong-format", "empty", "directory", "missing")


def write_text(path: Path) -> Path:
    path = path.with_name("notes.txt")
    path.write_text("these are not the weights you are looking for\n")
    return path


def write_safetensors(path: Path) -> Path:
    path = path.with_name("weights.safetensors")
    save_file({"w": torch.zeros(4)}, str(path))
    return path


def write_state_dict(path: Path) -> Path:
    path = path.with_name("state_dict.pt")
    torch.save({"w": torch.zeros(4)}, path)
    return path


WRONG_FORMAT: dict[str, Callable[[Path], Path]] = {
    "inspect": write_text,
    "diff": write_text,
    "flatten": write_text,
    # A checkpoint is the wrong format for activations' step, which needs a model to run (without --input,
    # activations counts a checkpoint's weights: test_activations_weights_of_a_file_that_is_no_checkpoint_...).
    "activations": write_safetensors,
    # explain takes a rule code and rules takes nothing: a checkpoint is wrong for both.
    "explain": write_state_dict,
    "rules": write_state_dict,
}


def make_input(kind: str, command: str, folder: Path) -> Path:
    target = folder / "input.pt"
    if kind == "wrong-format":
        return WRONG_FORMAT[command](target)
    if kind == "empty":
        target.write_bytes(b"")
    elif kind == "directory":
        target = folder / "a_folder"
        target.mkdir()
    else:
        assert kind == "missing"
    return target


def command_line(command: str, path: Path, good: Path) -> list[str]:
    """The command as a user types it, with an output that must not appear."""
    if command == "inspect":
        return ["inspect", str(path), "-o", "report.json", "--format", "json"]
    if command == "diff":
        return ["diff", str(good), str(path), "-o", "diff.json", "--format", "json"]
    if command == "flatten":
        return ["flatten", str(path), "-o", "flat.pt"]
    if command == "activations":
        return ["activations", str(path), "--input", "float32[2]", "-o", "activations.json", "--format", "json"]
    if command == "explain":
        return ["explain", str(path)]
    assert command == "rules"
    return ["rules", str(path)]


def run_memlayout(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memlayout", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_one_clean_error_line(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("memlayout: error: "), done.stderr
    assert "Traceback" not in done.stderr and not TORCH_LOG_LINE.match(lines[0]), done.stderr
    assert done.stdout == "", done.stdout


def test_the_commands_are_the_apps_commands() -> None:
    # A command added to the app without a line here would go untested.
    assert set(COMMANDS) == set(WRONG_FORMAT)


@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_error_is_one_line_exit_2_and_writes_nothing(command: str, kind: str, tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(4)}, good)
    path = make_input(kind, command, tmp_path)
    before = files_under(tmp_path)
    done = run_memlayout(command_line(command, path, good), tmp_path)
    assert_one_clean_error_line(done)
    assert files_under(tmp_path) == before


def test_diff_with_the_bad_side_first_is_one_line(tmp_path: Path) -> None:
    good = write_state_dict(tmp_path / "x")
    bad = write_text(tmp_path / "x")
    before = files_under(tmp_path)
    assert_one_clean_error_line(run_memlayout(["diff", str(bad), str(good), "-o", "diff.json"], tmp_path))
    assert files_under(tmp_path) == before


def write_dcp_directory(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    target = folder / "dcp_checkpoint"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"w": torch.zeros(4)}, checkpoint_id=str(target), no_dist=True)
    return target


def write_bare_pickle(folder: Path) -> Path:
    import pickle

    target = folder / "object.pkl"
    target.write_bytes(pickle.dumps({"step": 3}))
    return target


@pytest.mark.parametrize("write", [write_dcp_directory, write_bare_pickle], ids=["dcp", "bare-pickle"])
def test_flatten_refuses_a_format_it_cannot_write_in_one_line(write: Callable[[Path], Path], tmp_path: Path) -> None:
    path = write(tmp_path)
    before = files_under(tmp_path)
    assert_one_clean_error_line(run_memlayout(["flatten", str(path), "-o", "flat_out"], tmp_path))
    assert files_under(tmp_path) == before


ACTIVATIONS_TRUSTED = {
    "text": write_text,
    "empty": lambda p: (p.write_bytes(b""), p)[1],
    "state-dict": write_state_dict,
    "safetensors": write_safetensors,
}


@pytest.mark.parametrize("write", list(ACTIVATIONS_TRUSTED.values()), ids=list(ACTIVATIONS_TRUSTED))
def test_activations_with_trust_on_a_file_that_is_no_module_is_one_line(
    write: Callable[[Path], Path], tmp_path: Path
) -> None:
    # The hint of the refusal above says "pass --trust"; a user who does must still get one line.
    path = write(tmp_path / "input.pt")
    before = files_under(tmp_path)
    done = run_memlayout(["activations", str(path), "--input", "float32[2]", "--trust", "-o", "activations.json"],
                         tmp_path)
    assert_one_clean_error_line(done)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("kind", ["text", *INPUTS[1:]])
def test_activations_weights_of_a_file_that_is_no_checkpoint_is_one_line(kind: str, tmp_path: Path) -> None:
    """Without --input, activations counts the weights: of a checkpoint's headers too, so only what is no
    checkpoint (a text file, an empty file, an empty folder, nothing) is refused, in one line."""
    path = write_text(tmp_path / "x") if kind == "text" else make_input(kind, "activations", tmp_path)
    before = files_under(tmp_path)
    done = run_memlayout(["activations", str(path), "-o", "weights.json", "--format", "json"], tmp_path)
    assert_one_clean_error_line(done)
    assert files_under(tmp_path) == before
    if kind == "text":  # a checkpoint beside it is read
        done = run_memlayout(["activations", str(write_safetensors(tmp_path / "x")), "--format", "json"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert '"report": "activations-weights"' in done.stdout
