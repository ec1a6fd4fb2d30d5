"""A plain CNN's plans measured for real: no plan, each child checkpointed alone, checkpoint_sequential in N equal
segments, and what the budget search finds, each on a real CPU step (the allocator's events, AdamW, the second
step: tests/activations/measure.py's allocator_peak_step), beside memlayout's traced figure.

The CNN: nn.Sequential of six Conv2d(3x3, padding 1)/BatchNorm2d/ReLU blocks (32, 32, 64, 64, 128, 128 channels),
AdaptiveAvgPool2d(1), Flatten, Linear(128, 10); float32[8, 3, 64, 64] (tests/activations/segment_models.issue_cnn).

Usage: python -m benchmarks.accuracy.segments_cnn [--quick]   (--quick: no single children, splits 2 to 6)
Writes benchmarks/results/segments_cnn.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "segments_cnn.json"
BUDGET = 116_180_842
"""110.8 MiB, a third of the activations saved: the budget the issue's CNN was called unreachable at."""


def main(argv: list[str] | None = None) -> int:
    import memlayout.activations as act
    from memlayout.activations.plans.plan import Plan, SequentialSegments
    from tests.activations import segment_models
    from tests.activations.measure import allocator_peak_step

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args(argv)
    args, _ = segment_models.inputs((8, 3, 64, 64))
    started = time.perf_counter()

    def real(plan: Any) -> int:
        model = segment_models.issue_cnn()
        with act.apply_plan(model, plan):
            return allocator_peak_step(model, args, {}).peak_bytes

    rows: list[dict[str, Any]] = []

    def row(label: str, plan: Any, traced: int | None = None) -> None:
        rows.append({"plan": label, "real_peak_bytes": real(plan), "traced_peak_bytes": traced})
        print(f"{label:<48} real {rows[-1]['real_peak_bytes']:>12,} B"
              + (f"   traced {traced:>12,} B" if traced is not None else ""), flush=True)

    row("no plan", Plan(), act.analyze(segment_models.issue_cnn(), list(args)).summary.peak_bytes)
    if not options.quick:
        for child in range(21):
            row(f"checkpoint child {child} alone", Plan(checkpoint=(str(child),)))
    for segments in (range(2, 7) if options.quick else (2, 3, 4, 5, 6, 7, 8, 10, 12)):
        row(f"checkpoint_sequential, {segments} segments", Plan(sequential=(SequentialSegments("", segments),)))
    found = act.analyze(segment_models.issue_cnn(), list(args), budget=BUDGET).plan
    assert found is not None
    row(f"the search at --budget {BUDGET}: {found.plan.to_dict()}", found.plan, found.peak_bytes)
    try:
        act.analyze(segment_models.issue_cnn(), list(args), budget=1)
    except act.BudgetUnreachableError as unreachable:
        lowest = unreachable.lowest
        row(f"the lowest plan found: {lowest.plan.to_dict()}", lowest.plan, lowest.peak_bytes)
        message = unreachable.one_line()
    from memlayout.io.atomic_write import write_text

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.accuracy.segments_cnn" + (" --quick" if options.quick else "")
    write_text(str(RESULTS), json.dumps({"command": command, "budget_bytes": BUDGET, "rows": rows,
                                   "unreachable_message": message,
                                   "seconds": round(time.perf_counter() - started)}, indent=1) + "\n")
    print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
