"""Start-up: what a command costs beside its work, each run in a fresh process.

Usage: python benchmarks/speed/bench_startup.py [--quick]

The goal: `memlayout inspect` of a small safetensors file (8 tensors, 18 KiB, the
default table report) takes at most twice `python -c "import typer"`, the least a
typer command can cost. Beside it, for information: the same file as JSON,
`memlayout --help`, `memlayout rules`, and the floor, `python -c pass`. Every
command runs under measure_child.py (wall time and CPU time of that process
alone), in round-robin rounds so that the VM's drift hits all alike; the best
round counts. memlayout's bytecode is compiled first, as `pip install` does
(`harness.compile_bytecode`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import ROOT, Row, compile_bytecode, ms, print_table, quick_requested, write_results

GOAL = 2.0
HERE = Path(__file__).resolve().parent
DATA = ROOT / ".bench-data"


def small_safetensors() -> Path:
    """A small model's weights, as safetensors writes them: the typical pre-commit input."""
    path = DATA / "small-mlp.safetensors"
    if not path.exists():
        import torch
        from safetensors.torch import save_file

        torch.manual_seed(0)
        weights = {}
        for index, (rows, columns) in enumerate([(32, 16), (32, 32), (32, 32), (10, 32)]):
            weights[f"layers.{index}.weight"] = torch.randn(rows, columns)
            weights[f"layers.{index}.bias"] = torch.randn(rows)
        DATA.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        save_file(weights, str(partial))
        partial.replace(path)
    return path


def _measure(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(HERE / "measure_child.py"), *command], capture_output=True, text=True, check=True, cwd=ROOT
    )
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "memlayout"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memlayout"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = quick_requested(argv)
    compile_bytecode()
    small = small_safetensors()
    cli = _cli()
    commands = {
        "import typer": [sys.executable, "-c", "import typer"],
        "python -c pass": [sys.executable, "-c", "pass"],
        "memlayout inspect (table)": [*cli, "inspect", str(small)],
        "memlayout inspect --format json": [*cli, "inspect", str(small), "--format", "json"],
        "memlayout --help": [*cli, "--help"],
        "memlayout rules": [*cli, "rules"],
    }
    wall: dict[str, float] = dict.fromkeys(commands, float("inf"))
    cpu: dict[str, float] = dict.fromkeys(commands, float("inf"))
    for _ in range(5 if quick else 21):
        for name, command in commands.items():
            figures = _measure(command)
            if figures["exit"] not in (0, 1):
                raise RuntimeError(f"{' '.join(command)} exited {figures['exit']}")
            wall[name] = min(wall[name], figures["seconds"])
            cpu[name] = min(cpu[name], figures["cpu_seconds"])
    peer = wall["import typer"]
    rows = []
    for name in commands:
        if name == "import typer":
            continue
        ratio = wall[name] / peer
        headline = name == "memlayout inspect (table)"
        label = f"{name} ({small.name}, 8 tensors)" if "inspect" in name else name
        rows.append(Row(label, f"{ms(wall[name])} (CPU {ms(cpu[name])})", f"python -c \"import typer\" {ms(peer)}",
                        ratio, f"<= {GOAL}x" if headline else "(info)", ratio <= GOAL if headline else True))
    cpu_ratio = cpu["memlayout inspect (table)"] / cpu["import typer"]
    rows.append(Row("same inspect, CPU time", ms(cpu["memlayout inspect (table)"]),
                    f"import typer, CPU {ms(cpu['import typer'])}", cpu_ratio, "(info)", True))
    print_table(f"bench_startup: a command's start-up, fresh processes{' (quick)' if quick else ''}", rows)
    raw = {"wall_seconds": wall, "cpu_seconds": cpu, "file": {"path": str(small), "bytes": small.stat().st_size}}
    print(f"raw numbers: {write_results('startup', rows, raw, quick).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
