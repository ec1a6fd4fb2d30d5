"""A reader that stops early (`memlayout ... | head`) gets no error and changes no exit status (issue 21, item 3).

Each test runs the real command in a child process with its stdout on a pipe,
and closes the pipe's read end: before the command writes at all, so that its
first write fails with EPIPE, or, as `head` does, after reading a little of a
report far bigger than the pipe holds. Nothing may appear on stderr, and the
exit status must be the one the same command returns when its output is read to
the end (docs/exit-status.md).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from memlayout.cli.app import app
from memlayout.cli.formats import Command, formats_for

F_GETPIPE_SZ = 1032
"""fcntl's command for a Linux pipe's capacity."""
TIMEOUT_S = 300
FLAT_MODEL = "tests.activations.models:flat_cnn"


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "memlayout", *args]


def _pipe_capacity() -> int:
    read_end, write_end = os.pipe()
    try:
        return fcntl.fcntl(write_end, F_GETPIPE_SZ)
    except OSError:  # not Linux: take the most a pipe can be grown to without privileges
        return 1 << 20
    finally:
        os.close(read_end)
        os.close(write_end)


def _read_to_the_end(args: list[str]) -> tuple[int, int]:
    """(exit status, bytes written) when the output is read to the end (in-process: the same command)."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.stderr
    return result.exit_code, len(result.stdout_bytes)


def _reader_leaves(args: list[str], read_first: int) -> tuple[int, bytes, bytes]:
    """Run with stdout on a pipe whose reader reads `read_first` bytes and closes it (0: closed before the start).

    Returns:
        (exit status, what the reader got, stderr).
    """
    read_end, write_end = os.pipe()
    got = b""
    if not read_first:
        os.close(read_end)
    try:
        child = subprocess.Popen(_command(*args), stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    if read_first:
        while len(got) < read_first:
            chunk = os.read(read_end, read_first - len(got))
            if not chunk:
                break
            got += chunk
        os.close(read_end)
    _, stderr = child.communicate(timeout=TIMEOUT_S)
    return child.returncode, got, stderr


@pytest.fixture(scope="module")
def many_findings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,000 non-contiguous views: every report format runs to hundreds of KiB."""
    path = tmp_path_factory.mktemp("closed-pipe") / "many.pt"
    torch.save({f"layer{i}.weight": torch.zeros(2, 2)[:, :1] for i in range(1000)}, path)
    return path


@pytest.fixture(scope="module")
def many_changes(many_findings: Path) -> tuple[Path, Path]:
    """The same names in another dtype: a diff of 1,000 changes."""
    other = many_findings.with_name("many-half.pt")
    torch.save({f"layer{i}.weight": torch.zeros(2, 2, dtype=torch.float16) for i in range(1000)}, other)
    return many_findings, other


def _assert_quiet_with_the_full_status(args: list[str], read_first: int) -> None:
    status, size = _read_to_the_end(args)
    if read_first:
        # Python's own buffer holds 8 KiB more; beyond that a write must fail.
        assert size > _pipe_capacity() + read_first + 8192, f"{size} bytes fit in the pipe: no write would fail"
    code, got, stderr = _reader_leaves(args, read_first)
    assert stderr == b""
    assert code == status
    assert len(got) == read_first


# --fail-on never makes the full run's status 0: a closed pipe must not turn it into
# a failure (click's own EPIPE handling exits 1), nor the findings' 1 into a pass.
READERS = pytest.mark.parametrize("read_first", [0, 4096], ids=["reader-gone", "head"])


@READERS
@pytest.mark.parametrize("output_format", [f.value for f in formats_for(Command.INSPECT)])
def test_inspect_in_every_format(many_findings: Path, output_format: str, read_first: int) -> None:
    args = ["inspect", str(many_findings), "--format", output_format, "--all", "--fail-on", "never"]
    _assert_quiet_with_the_full_status(args, read_first)


@READERS
def test_inspect_keeps_the_status_of_its_findings(many_findings: Path, read_first: int) -> None:
    _assert_quiet_with_the_full_status(["inspect", str(many_findings), "--format", "json"], read_first)


@READERS
@pytest.mark.parametrize("output_format", [f.value for f in formats_for(Command.DIFF)])
def test_diff(many_changes: tuple[Path, Path], output_format: str, read_first: int) -> None:
    a, b = many_changes
    _assert_quiet_with_the_full_status(["diff", str(a), str(b), "--format", output_format, "--fail-on", "never"],
                                       read_first)


@READERS
def test_diff_keeps_the_status_of_its_changes(many_changes: tuple[Path, Path], read_first: int) -> None:
    a, b = many_changes
    _assert_quiet_with_the_full_status(["diff", str(a), str(b), "--format", "json"], read_first)


@pytest.mark.parametrize(
    "args",
    [
        ["rules"],
        ["explain", "ML101"],
        ["--version"],
        ["--help"],
        *(["activations", FLAT_MODEL, "--input", "float32[2,3,8,8]", "--format", f.value]
          for f in formats_for(Command.ACTIVATIONS)),
    ],
    ids=" ".join,
)
def test_short_outputs_into_a_pipe_nobody_reads(args: list[str]) -> None:
    # These fit in any pipe: the reader is gone before the first write, which fails.
    _assert_quiet_with_the_full_status(args, read_first=0)


def test_flatten_summary_into_a_pipe_nobody_reads(many_findings: Path, tmp_path: Path) -> None:
    out = tmp_path / "flat.pt"
    code, got, stderr = _reader_leaves(["flatten", str(many_findings), "-o", str(out)], read_first=0)
    assert (code, got, stderr) == (0, b"", b"")
    assert torch.load(out)["layer0.weight"].shape == (2, 1)  # the work was done, only the summary was dropped


def test_a_disk_that_is_full_is_still_an_error(many_findings: Path) -> None:
    # Only a reader that left is quiet: a write that fails for any other reason is one error line, exit 2.
    with open("/dev/full", "w") as full:
        done = subprocess.run(_command("inspect", str(many_findings), "--format", "json"), stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("memlayout: error:") and done.stderr.count("\n") == 1, done.stderr
