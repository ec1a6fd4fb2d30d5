"""Progress bars appear on a terminal's stderr and nowhere else (a real pty decides)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap

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


def run_child(stderr_is_terminal: bool) -> tuple[str, str]:
    """(stdout, stderr) of the child, its stderr a pty or a pipe."""
    if stderr_is_terminal:
        main, side = pty.openpty()
        child = subprocess.run([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=side, check=True,
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
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, check=True)
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
