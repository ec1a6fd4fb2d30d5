"""Every benchmark command the docs name still runs from where the docs say: `python benchmarks/...py` and
`python -m benchmarks....` as written in docs/*.md and benchmarks/**/README.md.

A script with an argument parser runs with `--help`. One without (most `bench_*.py` read `--quick` off argv and
would run the whole benchmark on anything else) is loaded as its command loads it, its own folder first on the
path, with every import it makes, but not run: `make bench --quick` is its quick mode, too slow for this test.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").rglob("README.md")])
COMMAND = re.compile(r"python (?:-m (benchmarks(?:\.[a-z_0-9]+)+)|(benchmarks/[a-z_0-9/]+\.py))")
PARSES_ARGUMENTS = re.compile(r"ArgumentParser\(|sweep_parser\(")
LOAD_SCRIPT = "import runpy, sys; sys.path.insert(0, sys.argv[2]); runpy.run_path(sys.argv[1], run_name='not_main')"
LOAD_MODULE = "import importlib, sys; importlib.import_module(sys.argv[1])"


def documented() -> list[str]:
    """Each script or module once: `benchmarks.x.y` or `benchmarks/x/y.py`."""
    found: set[str] = set()
    for page in PAGES:
        for module, path in COMMAND.findall(page.read_text()):
            found.add(module or path)
    return sorted(found)


def test_the_docs_name_each_kind_of_benchmark() -> None:
    kinds = {name.replace("/", ".").split(".")[1] for name in documented()}
    assert {"speed", "accuracy", "gpu"} <= kinds, kinds


@pytest.mark.parametrize("command", documented())
def test_a_documented_benchmark_command_runs(command: str) -> None:
    path = ROOT / (command if command.endswith(".py") else command.replace(".", "/") + ".py")
    assert path.is_file(), f"{command}: no such file"
    if PARSES_ARGUMENTS.search(path.read_text()):
        argv = [sys.executable, *((command,) if command.endswith(".py") else ("-m", command)), "--help"]
    elif command.endswith(".py"):
        argv = [sys.executable, "-c", LOAD_SCRIPT, command, str(path.parent)]
    else:
        argv = [sys.executable, "-c", LOAD_MODULE, command]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stderr[-2000:]}"
