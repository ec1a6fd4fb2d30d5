"""The budget search as it runs against a baseline, on models the tests do not name: the torchvision-style CNNs of
benchmarks/accuracy/cnn_zoo.py and a sample of the transformers zoo (benchmarks/accuracy/zoo/catalog.py).

Usage:
    git archive 6fcc236 memlayout | tar -x -C /tmp/before     # the memlayout before segment plans
    python -m benchmarks.accuracy.segments_sweep --sample 30 --seed 0 --before /tmp/before
    # baseline: no runs on their own
    python -m benchmarks.accuracy.segments_sweep --only resnet18 --only LlamaForCausalLM

For each model, each side in a process of its own with a timeout: the budget search (`analyze(..., budget=...)`)
at a budget no plan reaches (1 byte: the lowest plan found, and the figure the message names) and at
BUDGET_SHARES of the step's peak, as it runs here and in the baseline: the memlayout package under --before,
or without it this one with its planner offered no run of children on its own (modules and
checkpoint_sequential's equal splits). The CNNs' lowest plans also run on real CPU steps (the allocator's
events, tests/activations/measure.py), so a lower figure is a lower step, not a lower trace. The records go to
benchmarks/results/segments_sweep.json; the counts are printed: how often the lowest plan found changed, and
by how much.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "segments_sweep.json"
BUDGET_SHARES = (0.8, 0.6)
"""Budgets as shares of the step's peak without a plan, besides the one no plan reaches."""
TIMEOUT = 600.0


@contextlib.contextmanager
def without_segments() -> Iterator[None]:
    """The search as it ran before segment plans: its planner offers no run of children on its own."""
    from memlayout.activations import search
    from memlayout.activations.plans.plan import Planner

    search.Planner = functools.partial(Planner, segments=False)  # type: ignore[misc]
    try:
        yield
    finally:
        search.Planner = Planner  # type: ignore[misc]


def build(name: str) -> tuple[Any, tuple[Any, ...], dict[str, Any], str]:
    """The model, its step's inputs, and where it comes from."""
    from benchmarks import cnn_zoo

    if name in cnn_zoo.MODELS:
        import torch

        generator = torch.Generator().manual_seed(1)
        return cnn_zoo.MODELS[name](), (torch.randn(*cnn_zoo.INPUT, generator=generator),), {}, "torchvision-style"
    from benchmarks.accuracy.zoo.catalog import by_name

    arch = by_name()[name]
    built = arch.build()
    return built.model, built.args, built.kwargs, arch.family


def search(name: str, budget: int) -> dict[str, Any]:
    """One budget search's answer: the plan, its traced figure and how many plans it traced."""
    import memlayout.activations as act

    model, args, kwargs, _ = build(name)
    started = time.perf_counter()
    try:
        report = act.analyze(model, list(args), kwargs=kwargs, budget=budget, optimizer="adamw")
    except act.BudgetUnreachableError as unreachable:
        found, reached = unreachable.lowest, False
    else:
        assert report.plan is not None
        found, reached = report.plan, True
    plan = found.plan.to_dict()
    plan.setdefault("segments", [])  # an earlier memlayout's plans have no runs of their own
    return {"reached": reached, "plan": plan, "peak_bytes": found.judged_bytes, "checks": found.checks,
            "recompute_seconds": round(found.recompute_seconds, 6),
            "searched": getattr(found, "searched", "module plans"), "seconds": round(time.perf_counter() - started, 1)}


def real_peak(name: str, plan: dict[str, Any]) -> int:
    import memlayout.activations as act
    from tests.activations.measure import allocator_peak_step

    model, args, kwargs, _ = build(name)
    with act.apply_plan(model, plan):
        return allocator_peak_step(model, args, kwargs).peak_bytes


def check(name: str, side: str) -> dict[str, Any]:
    """One side's record of one model: its searches at each budget ("without": its planner offered no run of
    children on its own), and for a CNN its lowest plan on a real step."""
    import memlayout.activations as act

    model, args, kwargs, family = build(name)
    peak = act.analyze(model, list(args), kwargs=kwargs, optimizer="adamw").summary.peak_bytes
    record: dict[str, Any] = {"model": name, "family": family, "peak_bytes": peak}
    budgets = {"unreachable": 1, **{str(share): int(share * peak) for share in BUDGET_SHARES}}
    for label, budget in budgets.items():
        with without_segments() if side == "without" else contextlib.nullcontext():
            record[label] = search(name, budget)
    if family == "torchvision-style":
        record["real_lowest_bytes"] = real_peak(name, record["unreachable"]["plan"])
    return record


def compare(name: str, before: str | None, timeout: float) -> dict[str, Any]:
    """Both sides of one model, each in a process of its own: the search as it runs, and before (the memlayout
    package under `before`) or without runs of children on their own."""
    sides: dict[str, Any] = {}
    for side, baseline in (("with_segments", False), ("before" if before else "without_segments", True)):
        command = [sys.executable, "-m", "benchmarks.accuracy.segments_sweep", "--one", name,
                   "--side", "without" if baseline and not before else "with",
                   *(["--before", before] if baseline and before else [])]
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"model": name, "error": f"{side}: timed out after {timeout:.0f} s"}
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"model": name, "error": f"{side}: " + (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        sides[side] = json.loads(lines[-1])
    after, earlier = sides["with_segments"], sides["before" if before else "without_segments"]
    record = {"model": name, "family": after["family"], "peak_bytes": after["peak_bytes"],
              "baseline": earlier["memlayout"] if before else "without runs of children on their own"}
    for label in ("unreachable", *map(str, BUDGET_SHARES)):
        record[label] = {"budget_bytes": 1 if label == "unreachable" else int(float(label) * after["peak_bytes"]),
                         "baseline": earlier[label], "with_segments": after[label]}
    record["lowest_changed"] = earlier["unreachable"]["plan"] != after["unreachable"]["plan"]
    if "real_lowest_bytes" in after:
        record["real_lowest_baseline"] = earlier["real_lowest_bytes"]
        record["real_lowest_with_segments"] = after["real_lowest_bytes"]
    return record


def selected(sample: int | None, seed: int, only: list[str]) -> list[str]:
    from benchmarks import cnn_zoo
    from benchmarks.accuracy.zoo.catalog import architectures

    names = [a.name for a in architectures() if a.family not in ("diffusion", "torch.nn")]
    if only:
        return only
    if sample is not None:
        import random

        names = random.Random(seed).sample(names, min(sample, len(names)))
    return [*cnn_zoo.MODELS, *names]


def summary(records: list[dict[str, Any]]) -> list[str]:
    done = [r for r in records if "error" not in r]
    changed = [r for r in done if r["lowest_changed"]]
    lower = [r for r in changed if r["unreachable"]["with_segments"]["peak_bytes"]
             < r["unreachable"]["baseline"]["peak_bytes"]]
    higher = [r for r in changed if r["unreachable"]["with_segments"]["peak_bytes"]
              > r["unreachable"]["baseline"]["peak_bytes"]]
    lines = [f"{len(done)} models searched ({len(records) - len(done)} failed or timed out); the lowest plan found "
             f"changed on {len(changed)}: lower on {len(lower)}, higher on {len(higher)}, as low on "
             f"{len(changed) - len(lower) - len(higher)}"]
    for r in sorted(lower, key=lambda r: r["unreachable"]["with_segments"]["peak_bytes"]
                    / r["unreachable"]["baseline"]["peak_bytes"]):
        a, b = r["unreachable"]["baseline"]["peak_bytes"], r["unreachable"]["with_segments"]["peak_bytes"]
        real = (f"; real {r['real_lowest_baseline']:,} -> {r['real_lowest_with_segments']:,} B"
                if "real_lowest_with_segments" in r else "")
        lines.append(f"  lower: {r['model']}: {a:,} -> {b:,} B ({b / a:.3f}x){real}")
    for r in higher:
        a, b = r["unreachable"]["baseline"]["peak_bytes"], r["unreachable"]["with_segments"]["peak_bytes"]
        lines.append(f"  higher: {r['model']}: {a:,} -> {b:,} B ({b / a:.3f}x)")
    for share in BUDGET_SHARES:
        key = str(share)
        newly = [r["model"] for r in done if r[key]["with_segments"]["reached"] and not r[key]["baseline"]["reached"]]
        lost = [r["model"] for r in done if r[key]["baseline"]["reached"] and not r[key]["with_segments"]["reached"]]
        lines.append(f"budget {share:.0%} of the peak: reached by both on "
                     f"{sum(r[key]['with_segments']['reached'] and r[key]['baseline']['reached'] for r in done)}, "
                     f"only now on {len(newly)} {newly[:8]}, only by the baseline on {len(lost)} {lost}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--timeout", type=float, default=TIMEOUT)
    parser.add_argument("--before", help="a directory holding an earlier memlayout package to compare with "
                        "(git archive COMMIT memlayout | tar -x -C DIR); without it, the search without runs of "
                        "children on their own")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the records go (default: %(default)s)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="with", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one:
        if options.before:  # ahead of this checkout, which `-m` puts first on the path
            sys.path.insert(0, options.before)
        import memlayout

        record = check(options.one, options.side)
        record["memlayout"] = str(Path(memlayout.__file__).parent)
        print(json.dumps(record))
        return 0
    records = []
    started = time.perf_counter()
    for name in selected(options.sample, options.seed, options.only):
        record = compare(name, options.before, options.timeout)
        records.append(record)
        print(f"{name}: " + (record.get("error") or ("lowest changed" if record["lowest_changed"] else "same")),
              flush=True)
    command = "python -m benchmarks.accuracy.segments_sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {"command": command.strip(), "seconds": round(time.perf_counter() - started), "records": records,
              "summary": summary(records)}
    from memlayout.io.atomic_write import write_text

    options.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(options.out), json.dumps(result, indent=1) + "\n")
    print("\n".join(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
