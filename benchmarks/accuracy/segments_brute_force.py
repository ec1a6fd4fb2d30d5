"""The figures behind tests/activations/plans/test_segments_brute_force.py (and test_segments_slow.py with --large): for
each small model, the lowest real peak of every plan of its space (tests/activations/brute_force.py) against the
lowest plan the budget search finds, applied to a real step, and the figure its unreachable message names.

Usage: python -m benchmarks.accuracy.segments_brute_force [--large]
Writes benchmarks/results/segments_brute_force[_large].json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    import memlayout.activations as act
    from memlayout.io.atomic_write import write_text
    from tests.activations import brute_force
    from tests.activations.plans.test_segments_brute_force import CASES
    from tests.activations.plans.test_segments_slow import LARGE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true")
    options = parser.parse_args(argv)
    rows = []
    started = time.perf_counter()
    print(f"{'model':<18}{'plans':>6}{'no plan':>14}{'brute force':>14}{'search, real':>14}{'named':>14}{'ratio':>7}")
    for name, (build, make_inputs, space) in (LARGE if options.large else CASES).items():
        args, kwargs = make_inputs()
        best_plan, best, count = brute_force.lowest(build, args, kwargs, space)
        try:
            act.analyze(build(), list(args), kwargs=kwargs, budget=1)
        except act.BudgetUnreachableError as unreachable:
            lowest = unreachable.lowest
        real = brute_force.real_peak(build, args, kwargs, lowest.plan)
        plain = brute_force.real_peak(build, args, kwargs, {})
        rows.append({"model": name, "plans": count, "no_plan_bytes": plain, "brute_force_bytes": best,
                     "brute_force_plan": best_plan.to_dict(), "search_plan": lowest.plan.to_dict(),
                     "search_real_bytes": real, "named_bytes": lowest.judged_bytes, "checks": lowest.checks})
        print(f"{name:<18}{count:>6}{plain:>14,}{best:>14,}{real:>14,}{lowest.judged_bytes:>14,}{real / best:>7.3f}",
              flush=True)
    command = "python -m benchmarks.accuracy.segments_brute_force" + (" --large" if options.large else "")
    path = ROOT / "benchmarks" / "results" / f"segments_brute_force{'_large' if options.large else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(path), json.dumps({"command": command, "rows": rows,
                                      "seconds": round(time.perf_counter() - started)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
