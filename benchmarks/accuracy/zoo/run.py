"""Run the sweep: each architecture in a process of its own, with a timeout, so one crash or hang stops nothing.

Usage:
    python -m benchmarks.accuracy.zoo.run                      # every architecture
    python -m benchmarks.accuracy.zoo.run --arch LlamaForCausalLM --arch BertForMaskedLM
    python -m benchmarks.accuracy.zoo.run --rerun failed       # the records not ok within 2% (or missing)
    # the unchecked, in random order:
    python -m benchmarks.accuracy.zoo.run --rerun missing --sample 500 --stop-after 3000
    python -m benchmarks.accuracy.zoo.run --family causal-lm --jobs 2 --timeout 300
    python -m benchmarks.accuracy.zoo.run --size large --no-plans --sample 80 --seed 0

Records land in benchmarks/results/activations_zoo.json after every
architecture (a partial run keeps the other records), the sweep's time in
activations_zoo_sweep.json, and docs/activations-zoo.md is written from both.
A sweep at another size (--size large, tiny.py's SIZES) or without the plan
stages (--no-plans) writes activations_zoo_<size>[_peaks].json and
activations_zoo_<size>[_peaks]_sweep.json instead, and leaves the page alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results" / "activations_zoo.json"
SWEEP = ROOT / "benchmarks" / "results" / "activations_zoo_sweep.json"
STAGE = "zoo-stage: "
"""check.py announces each stage on stderr, so a timeout or a crash says where it happened."""
UNSUPPORTED_STAGES = ("build", "real step")


def results_paths(size: str, plans: bool) -> tuple[Path, Path]:
    """Where a sweep's records and its run go: the default sweep's files, or files of their own."""
    if size == "small" and plans:
        return RESULTS, SWEEP
    stem = f"activations_zoo_{size}" + ("" if plans else "_peaks")
    return RESULTS.with_name(f"{stem}.json"), RESULTS.with_name(f"{stem}_sweep.json")


def load_records(path: Path = RESULTS) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    return {record["architecture"]: record for record in json.loads(path.read_text())}


def needs_rerun(record: dict[str, Any] | None) -> bool:
    """A record that is missing, or not ok with its prediction within 2% and its plan verified."""
    if record is None:
        return True
    # "not run": a sweep without the plan stages (--no-plans) judges the unplanned prediction alone
    return not (record["status"] == "ok" and record.get("within_2pct") and
                record["plan"] in ("verified", "unreachable-verified", "not run"))


def select(catalog: list[Any], records: dict[str, dict[str, Any]], arch: list[str], family: list[str],
           rerun: str | None, sample: int | None, seed: int) -> list[Any]:
    """The catalog's entries a sweep runs, in the order it runs them.

    rerun "failed" takes the records `needs_rerun` names, "missing" only those never
    checked. A sample comes in its own random order, even when it takes them all:
    a sweep stopped early has still checked a random sample.
    """
    selected = [
        entry for entry in catalog
        if ((not arch and not family) or entry.name in arch or entry.family in family)
        and (rerun is None
             or (records.get(entry.name) is None if rerun == "missing" else needs_rerun(records.get(entry.name))))
    ]
    if sample is not None:
        import random

        selected = random.Random(seed).sample(selected, min(sample, len(selected)))
    return selected


@dataclass
class Child:
    """One architecture's check, running in a process of its own."""

    entry: Any
    process: Any
    results: Any
    stderr: Any
    started: float


def start_child(entry: Any) -> Child:
    # Spawn, never fork: a parent that has run a backward pass (a pytest worker, after other
    # tests) holds autograd's worker threads, and torch refuses to run autograd in a child
    # forked from it ("Unable to handle autograd's threading in combination with fork-based
    # multiprocessing"). A spawned child imports torch afresh, which costs each check a few
    # seconds. It gets the log file by name: spawn passes no other descriptor.
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    stderr = tempfile.NamedTemporaryFile(mode="w+b", prefix="zoo-check-", suffix=".log")  # noqa: SIM115 (closed when the child's record is taken)
    process = context.Process(target=_child_main, args=(entry, send, stderr.name), daemon=True)
    process.start()
    send.close()
    return Child(entry, process, receive, stderr, time.perf_counter())


def _child_main(entry: Any, results: Any, stderr_path: str) -> None:
    from benchmarks.accuracy.zoo.check import run_check

    # transformers' and torch's warnings go to the log, not the sweep's output; sys.stderr is
    # reopened on the new descriptor too, in case the parent had replaced it (pytest's capture)
    log = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 2)
    os.close(log)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as long as the child)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    results.send(run_check(entry))
    results.close()


def finish_child(child: Child, timeout: float) -> dict[str, Any] | None:
    """The child's record once it is done; None while it still runs within its time."""
    entry = child.entry
    elapsed = time.perf_counter() - child.started
    if child.results.poll(0.2):
        try:
            record: dict[str, Any] = child.results.recv()
        except EOFError:
            record = {}
        child.process.join()
        if record:
            child.stderr.close()
            return record
        return _ended(entry, child, f"the process ended during the {{stage}} (exit status {child.process.exitcode})")
    if not child.process.is_alive():
        child.process.join()
        return _ended(entry, child, f"the process ended during the {{stage}} (exit status {child.process.exitcode})")
    if elapsed > timeout:
        child.process.kill()
        child.process.join()
        return _ended(entry, child, f"timed out after {timeout:.0f} s during the {{stage}}")
    return None


def _ended(entry: Any, child: Child, reason: str) -> dict[str, Any]:
    child.stderr.seek(0)
    text = child.stderr.read().decode(errors="replace")
    child.stderr.close()
    stages = [line[len(STAGE):] for line in text.splitlines() if line.startswith(STAGE)]
    stage = stages[-1] if stages else "start"
    tail = [line for line in text.strip().splitlines() if line and not line.startswith(STAGE)]
    reason = reason.format(stage=stage)
    if tail and "timed out" not in reason:
        reason += f": {tail[-1][:300]}"
    return {
        "architecture": entry.name, "source": entry.source, "family": entry.family,
        "status": "unsupported" if stage in UNSUPPORTED_STAGES else "failed",
        "predicted_peak_bytes": None, "measured_peak_bytes": None, "ratio": None, "within_2pct": None,
        "plan": "failed" if stage.startswith(("plan", "unreachable")) else "none", "reason": reason,
        "seconds": round(time.perf_counter() - child.started, 1),
    }


def write_json(path: Path, data: Any) -> None:
    from memlayout.io.atomic_write import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(path), json.dumps(data, indent=1) + "\n")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for package in ("torch", "transformers", "diffusers"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    # The records are only as current as the code that made them: name the commit, and say when the
    # working tree differed from it.
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "memlayout", "benchmarks"],
                           cwd=ROOT, capture_output=True, text=True)
    found["memlayout"] = head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") or "unknown"
    return found


def _schedule(pending: list[tuple[int, Any]], running: list[tuple[int, Child]], options: Any,
              records: dict[str, dict[str, Any]], order: dict[str, int]) -> None:
    """Keep `options.jobs` children running until every architecture has its record."""
    total = len(pending)
    while pending or running:
        if options.stop_after is not None and time.perf_counter() - options.started > options.stop_after and pending:
            options.not_checked = [entry.name for _, entry in pending]
            pending.clear()  # the checks running finish; no new one starts
        while pending and len(running) < max(1, options.jobs):
            index, entry = pending.pop(0)
            running.append((index, start_child(entry)))
        for index, child in list(running):
            record = finish_child(child, options.timeout)
            if record is None:
                continue
            running.remove((index, child))
            records[child.entry.name] = record
            kept = sorted((r for n, r in records.items() if n in order), key=lambda r: order[r["architecture"]])
            write_json(options.results, kept)
            ratio = f"{record['ratio']:.3f}x" if record.get("ratio") is not None else "-"
            print(f"[{index + 1}/{total}] {child.entry.name}: {record['status']}, {ratio}, "
                  f"plan {record['plan']}, {record['seconds']} s {record['reason'][:150]}", flush=True)


def main(argv: list[str]) -> int:
    from benchmarks.accuracy.zoo.catalog import architectures

    parser = argparse.ArgumentParser(prog="python -m benchmarks.accuracy.zoo.run", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=[], help="an architecture to run (repeatable)")
    parser.add_argument("--family", action="append", default=[],
                        help="every architecture of a family (with --arch: either)")
    parser.add_argument("--rerun", choices=("failed", "missing"),
                        help="failed: only the records not ok within 2%%, or missing; missing: only those never "
                             "checked")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per architecture (default 300)")
    parser.add_argument("--jobs", type=int, default=1, help="architectures run at once (default 1)")
    parser.add_argument("--size", choices=("small", "large"), default="small",
                        help="the tiny configs' size (benchmarks/accuracy/zoo/tiny.py SIZES; default small)")
    parser.add_argument("--no-plans", action="store_true", help="check the unplanned prediction only")
    parser.add_argument("--sample", type=int, help="a seeded random sample of this many of the selected")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--stop-after", type=float,
                        help="start no new check after this many seconds; the record says which were not checked")
    parser.add_argument("--list", action="store_true", help="list the architectures and exit")
    parser.add_argument("--command", default="python -m benchmarks.accuracy.zoo.run",
                        help="how the sweep was started, for the docs")
    options = parser.parse_args(argv)
    from benchmarks.accuracy.zoo.check import PLANS_VARIABLE
    from benchmarks.accuracy.zoo.tiny import SIZE_VARIABLE

    # The spawned checks read both when they import tiny.py and decide on the plan stages.
    os.environ[SIZE_VARIABLE] = options.size
    os.environ[PLANS_VARIABLE] = "0" if options.no_plans else "1"
    options.results, sweep_path = results_paths(options.size, not options.no_plans)

    catalog = architectures()
    if options.list:
        for entry in catalog:
            print(f"{entry.family:22s} {entry.name:50s} {entry.source}")
        return 0
    records = load_records(options.results)
    unknown = sorted(set(options.arch) - {entry.name for entry in catalog})
    if unknown:
        print(f"not in the catalog: {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    selected = select(catalog, records, options.arch, options.family, options.rerun, options.sample, options.seed)
    full = not options.arch and not options.family and options.rerun is None and options.sample is None
    order = {entry.name: index for index, entry in enumerate(catalog)}
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = time.perf_counter()
    options.started, options.not_checked = started, []
    pending = list(enumerate(selected))
    running: list[tuple[int, Child]] = []
    try:
        _schedule(pending, running, options, records, order)
    finally:
        for _, child in running:  # interrupted: no check outlives the sweep
            child.process.kill()
    wall = round(time.perf_counter() - started, 1)

    sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else {}
    run = {"started": started_at, "wall_seconds": wall, "architectures": len(selected), "jobs": options.jobs,
           "timeout_seconds": options.timeout, "command": options.command, "versions": versions(),
           "size": options.size, "plans": not options.no_plans}
    if options.sample is not None:
        run["sample"] = {"size": options.sample, "seed": options.seed}
    if options.not_checked:
        run["not_checked"] = options.not_checked
    if full or (options.sample is not None and options.rerun is None):
        sweep = {"full_sweep": run, "reruns": []}
    else:
        sweep.setdefault("reruns", []).append({**run, "selected": [entry.name for entry in selected][:50]})
    write_json(sweep_path, sweep)

    if options.results == RESULTS:
        from benchmarks.accuracy.zoo.render import write_docs

        write_docs()
    print(f"{len(selected)} architectures in {wall} s; results in {options.results.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
