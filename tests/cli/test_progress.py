"""Progress bars appear on a terminal's stderr and nowhere else (a real pty decides)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A child that reports flatten's stages through the display, as the flatten command does.
CHILD = textwrap.dedent(
    """
    from memlayout.cli.progress import FLATTEN_STAGES, stage_progress
    with stage_progress(FLATTEN_STAGES) as progress:
        print("callable" if progress is not None else "none", flush=True)
        if progress is not None:
            for task in ("copy", "write", "verify"):
                for done in range(0, (1 << 20) + 1, 1 << 18):
                    progress(task, done, 1 << 20)
    """
)


def run_child(stderr_is_terminal: bool, args: list[str] | None = None) -> tuple[str, str]:
    """(stdout, stderr) of the child (CHILD, or `args`), its stderr a pty or a pipe."""
    command = args or [sys.executable, "-c", CHILD]
    if stderr_is_terminal:
        main, side = pty.openpty()
        child = subprocess.run(command, stdout=subprocess.PIPE, stderr=side, check=True,
                               env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
        os.close(side)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the pty's other end is closed: everything is read
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(main)
        return child.stdout.decode(), b"".join(chunks).decode(errors="replace")
    child = subprocess.run(command, capture_output=True, check=True)
    return child.stdout.decode(), child.stderr.decode()


def test_a_terminal_gets_a_bar_per_stage_in_bytes() -> None:
    out, err = run_child(stderr_is_terminal=True)
    assert out.strip() == "callable"
    for label in ("bytes copied", "bytes written", "verification"):
        assert label in err
    assert "1.0/1.0 MiB" in err  # byte counts, in binary units
    assert "\x1b[" in err  # drawn with terminal control codes


def test_a_pipe_gets_nothing() -> None:
    out, err = run_child(stderr_is_terminal=False)
    assert out.strip() == "none" and err == ""


@pytest.mark.parametrize("terminal", [True, False])
def test_flatten_shows_copy_and_verification_only_on_a_terminal(terminal: bool, repo_root: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "flat.pt"
    command = [sys.executable, "-m", "memlayout", "flatten", str(repo_root / "fixtures" / "demo_checkpoint.pt"),
               "-o", str(out)]
    stdout, stderr = run_child(terminal, command)
    assert "flattened" in stdout and "verified" in stdout and out.exists()
    if terminal:
        assert "bytes copied" in stderr and "verification" in stderr
        # Each bar ends full: every byte copied and verified.
        copied = re.findall(r"bytes copied.*?([\d.]+)/([\d.]+) ([KMG]iB|bytes)", stderr)
        assert copied and copied[-1][0] == copied[-1][1]
    else:
        assert stderr == ""
