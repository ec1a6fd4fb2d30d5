"""The "Will it fit?" table, rendered from benchmarks/results/will_it_fit.json (written by bench_ranks.py).

docs/evidence-fit.md names the table by a marker that the site's build replaces
with this rendering (docs/hooks.py), so the page shows the last benchmark's
figures and cannot drift from them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "will_it_fit.json"
MARKER = "<!-- memlayout:will-it-fit -->"


def _gib(count: float) -> str:
    """GiB from 1 GiB on; below, exact bytes, where the ranks and the tools differ by kilobytes."""
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{int(count):,} B"


def table_markdown(results: dict[str, Any] | None = None) -> str:
    """The side-by-side table, then each figure's command, per model."""
    results = results if results is not None else json.loads(RESULTS.read_text())
    lines = [
        "| model | ranks | tokens per rank | memlayout (largest rank) | FSDPMemTracker, fake ranks | real ranks here "
        "| accelerate, Training using Adam | DeepSpeed ZeRO-3, model states per GPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    commands: list[str] = []
    for key, figures in results.items():
        case = figures["case"]
        ours = figures["memlayout"]
        real = figures.get("real")
        if real:
            measured = " / ".join(f"{_gib(v)} (rank {k})" for k, v in sorted(real["ranks"].items()))
        else:
            measured = "does not fit this machine"
        per_rank = " / ".join(f"{_gib(r['peak_bytes'])}" + (f" (rank {_ranges(r)})" if len(ours["ranks"]) > 1 else "")
                              for r in ours["ranks"])
        lines.append(
            f"| {case['label']} | {case['world_size']} | {case['batch']}x{case['length']} | {per_rank} "
            f"| {_gib(figures['fsdpmemtracker']['peak_bytes'])} | {measured} "
            f"| {_gib(figures['accelerate']['training_adam_bytes'])} | {_gib(figures['deepspeed']['per_gpu_bytes'])} |"
        )
        commands.append(f"**{case['label']}, {case['world_size']} ranks** (`{key}`):\n")
        commands.append(f"- memlayout: `{figures['memlayout_command']}`")
        for name, title in (("fsdpmemtracker", "FSDPMemTracker"), ("real", "real ranks"),
                            ("accelerate", "accelerate"), ("deepspeed", "DeepSpeed")):
            if name in figures:
                commands.append(f"- {title}: `{figures[name]['command']}`")
        commands.append("")
    return "\n".join(lines) + "\n\nEach figure's command, run from the repository's root:\n\n" + "\n".join(commands)


def _ranges(rank: dict[str, Any]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in rank["same_layout"])
