"""The reading commands, run as `pip install memlayout` (no torch) gives them.

`make test-core` runs this folder in a second virtual environment without torch,
on checkpoints the full install's real writers made (MEMLAYOUT_CORE_FIXTURES).
`make test` runs it too, with those checkpoints written here and torch (with
safetensors and isal, which memlayout does not depend on without torch) made
unimportable in each command's process, so a reading path that starts needing
torch fails in the everyday suite already.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES_ENV = "MEMLAYOUT_CORE_FIXTURES"
"""Set by `make test-core`: the folder of checkpoints, and the sign that this is the torch-free install."""

REPO = Path(__file__).resolve().parents[2]

# Runs the real entry point, with the torch extra's modules refused as if absent.
_LAUNCH = (
    "import sys\n"
    "for name in ('torch', 'safetensors', 'isal'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv[0] = 'memlayout'\n"
    "from memlayout.cli.app import entry\n"
    "entry()\n"
)


def core_install() -> bool:
    return bool(os.environ.get(FIXTURES_ENV))


def memlayout(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`memlayout ARGS...` in a fresh process without torch."""
    return subprocess.run(
        [sys.executable, "-c", _LAUNCH, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300,
    )


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a small checkpoint of every format memlayout reads."""
    given = os.environ.get(FIXTURES_ENV)
    if given:
        folder = Path(given)
        if not folder.is_dir():
            pytest.fail(f"{FIXTURES_ENV}={given} is no folder: `make test-core` writes it")
        return folder
    # The real writers need torch: the full install has it.
    sys.path.insert(0, str(REPO))
    from fixtures.make_format_fixtures import write_all

    folder = tmp_path_factory.mktemp("formats")
    write_all(folder)
    return folder
