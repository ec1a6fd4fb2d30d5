"""Run every benchmark script in benchmarks/ (`make bench`), each printing its ratio table.

Usage: python benchmarks/run_all.py [--quick]

`--quick` (or MEMLAYOUT_BENCH_QUICK=1) uses small sizes and few repeats: minutes,
not tens of minutes. Raw numbers land in benchmarks/results/*.json. Exits non-zero
when a benchmark script fails to run; missed goals show as "NO" in the tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICK_ENV = "MEMLAYOUT_BENCH_QUICK"
# Ours first (cheap to skim), then whatever else lives here: bench_flatten.py
# belongs to the flatten work and runs if present.
ORDER = ["bench_startup.py", "bench_inspect.py", "bench_deep.py"]
NEEDS_CUDA_BUILD = {"bench_cuda_prediction.py", "bench_sweep.py", "bench_torchtitan.py"}
"""Scripts that trace fake CUDA tensors, which need torch's CUDA build (no GPU): `make bench`'s own venv has
the CPU wheel, so these run with the newest `.venv-torch-<version>` the Makefile's torch matrix built, where
there is one, and otherwise with this interpreter, where they say what they need and exit 0."""


def torch_venv_version(python: Path) -> tuple[int, ...]:
    version = python.parent.parent.name.removeprefix(".venv-torch-")
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def interpreter(script: Path) -> str:
    """The Python that runs `script`: this one, or for a script that needs the CUDA build the torch matrix's newest."""
    if script.name in NEEDS_CUDA_BUILD:
        built = sorted(HERE.parent.glob(".venv-torch-*/bin/python"), key=torch_venv_version)
        if built:
            return str(built[-1])
    return sys.executable


def scripts() -> list[Path]:
    # Each kind of measurement has its folder (speed/, accuracy/, gpu/); a script is found in any of them.
    found = sorted(HERE.glob("*/bench_*.py"))
    return sorted(found, key=lambda p: (ORDER.index(p.name) if p.name in ORDER else len(ORDER), p.name))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv or os.environ.get(QUICK_ENV, "") not in ("", "0")
    env = dict(os.environ)
    if quick:
        env[QUICK_ENV] = "1"
    failed = []
    for script in scripts():
        # Only pass --quick to scripts that accept it; the others see the env variable.
        args = ["--quick"] if quick and "--quick" in script.read_text() else []
        print(f"\n=== {script.name} {' '.join(args)}", flush=True)
        start = time.perf_counter()
        python = interpreter(script)
        if python != sys.executable:
            print(f"=== with {python}", flush=True)
        result = subprocess.run([python, str(script), *args], env=env, check=False)
        print(f"=== {script.name}: exit {result.returncode} in {time.perf_counter() - start:.0f} s", flush=True)
        if result.returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
