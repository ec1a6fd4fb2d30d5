"""`.ci/run` fails on a lint or docs error, or a failure of the torch-free install's tests or of the
torch matrix, as on a test failure, and runs every target either way, the full install's tests last."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("lint", "docs", "core", "matrix", "test", "expected"),
    [
        (0, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 1), (0, 1, 0, 0, 0, 1), (1, 1, 0, 0, 0, 1), (0, 0, 3, 0, 0, 3),
        (1, 0, 3, 0, 0, 1), (0, 0, 0, 4, 0, 4), (0, 0, 3, 4, 0, 3), (1, 0, 0, 4, 0, 1),
        (0, 0, 0, 0, 2, 2), (1, 0, 0, 0, 2, 2), (0, 1, 0, 0, 2, 2), (0, 0, 3, 0, 2, 2), (0, 0, 0, 4, 2, 2),
    ],
)
def test_ci_runs_lint_docs_and_every_installs_tests(
    repo_root: Path, tmp_path: Path, lint: int, docs: int, core: int, matrix: int, test: int, expected: int
) -> None:
    # A stand-in `make` first on PATH records each target and exits as told.
    log = tmp_path / "targets"
    fake = tmp_path / "bin" / "make"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> {log}\n'
        f'case "$1" in lint) exit {lint};; docs) exit {docs};; test-core) exit {core};; test-torch-matrix) exit '
        f'{matrix};; test) exit {test};; esac\n'
        "exit 99\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(repo_root / ".ci" / "run")], env=env, capture_output=True, text=True)
    assert result.returncode == expected
    assert log.read_text().split() == ["lint", "docs", "test-core", "test-torch-matrix", "test"]
