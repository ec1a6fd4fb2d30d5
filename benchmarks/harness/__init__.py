"""What every memlayout benchmark shares: best-of-N timing, one ratio table, raw JSON.

Each benchmark compares against a peer or the machine's limit measured in the same
run, because this kind of VM's speed drifts by 2x between minutes; ratios taken
within one run hold up where absolute numbers do not.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
QUICK_ENV = "MEMLAYOUT_BENCH_QUICK"


def quick_requested(argv: list[str]) -> bool:
    """`--quick` on the command line or MEMLAYOUT_BENCH_QUICK=1: small sizes, few repeats."""
    return "--quick" in argv or os.environ.get(QUICK_ENV, "") not in ("", "0")


def compile_bytecode() -> None:
    """Compile memlayout's modules to bytecode once, as `pip install` does, before timing a command.

    The checkout is installed in editable mode, and where PYTHONDONTWRITEBYTECODE is
    set (it often is in CI and containers) every command would compile every module
    it imports, on every run: about 70 ms of CPU for an inspect of a small file on
    the development VM, which no user of a wheel pays. Existing
    bytecode is read whatever that variable says, so compiling it here once makes
    each command start as an installed memlayout starts.
    """
    import compileall

    compileall.compile_dir(str(ROOT / "memlayout"), quiet=1)


def best_of(function: Callable[[], object], repeat: int) -> float:
    """The fastest of `repeat` runs, in seconds: the run least disturbed by the machine."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def round_robin(functions: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best time of each function, run in interleaved rounds so that drift hits all alike."""
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(repeat):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


@dataclass(frozen=True)
class Row:
    """One line of a ratio table."""

    metric: str
    value: str
    """The measured figure, human-readable."""
    peer: str
    """What it is compared with, and that figure."""
    ratio: float
    goal: str
    """The target, e.g. "<= 0.5x"."""
    met: bool


def print_table(title: str, rows: list[Row]) -> None:
    """The one table a benchmark prints."""
    headers = ("metric", "value", "peer / limit", "ratio", "goal", "met")
    cells = [(r.metric, r.value, r.peer, f"{r.ratio:.2f}x", r.goal, "yes" if r.met else "NO") for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print(line)
    for cell in cells:
        print("  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)))
    sys.stdout.flush()


def machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor(),
    }


def write_results(name: str, rows: list[Row], raw: dict[str, Any], quick: bool) -> Path:
    """Raw numbers and the table's rows to benchmarks/results/<name>.json (quick runs: <name>-quick.json)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'-quick' if quick else ''}.json"
    payload = {
        "benchmark": name,
        "quick": quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "rows": [asdict(r) for r in rows],
        "raw": raw,
    }
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(temporary, path)
    return path


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def read_results(name: str) -> dict[str, Any]:
    """The results file of benchmark `name` from the last full run (what `write_results` wrote)."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def goal_cell(row: dict[str, Any]) -> str:
    """A row's goal and whether it was met; figures shown for information carry no verdict."""
    goal = row["goal"]
    if goal.startswith("("):
        return goal
    return f"{goal}: met" if row["met"] else f"{goal}: **not met**"


def results_markdown(results: dict[str, Any]) -> str:
    """A results file's rows as one Markdown table, under when and where it was measured."""
    machine = results["machine"]
    lines = [
        f"Measured {results['when']} on {machine['cpus']} CPUs, Python {machine['python']}, "
        f"{machine['platform']}{' (quick run)' if results['quick'] else ''}.",
        "",
        "| figure | value | peer / limit | ratio | goal |",
        "|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        cells = (row["metric"], row["value"], row["peer"], f"{row['ratio']:.2f}x", goal_cell(row))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
