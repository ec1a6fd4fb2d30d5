"""`--step inference` over the zoo's architectures: the prediction against a real forward's allocator events.

For each architecture of the zoo catalog (benchmarks/accuracy/zoo/catalog.py, the models of
transformers' and diffusers' registries built from tiny configs), in a fresh process
with a timeout:
- the real forward as serving code runs it (eval mode, `torch.inference_mode`), its peak
  by the CPU allocator's own events (tests/activations/measure.py's
  allocator_inference_peak), a first forward run unprofiled;
- memlayout's prediction, `analyze(..., step="inference")`, on fake tensors.

A record is within 2% when the two peaks are. Prints each ratio and the share within
2%, and writes benchmarks/results/inference_sweep.json.

Usage:
    python -m benchmarks.accuracy.inference_sweep --sample 60 --seed 5 --jobs 2
    python -m benchmarks.accuracy.inference_sweep --arch LlamaForCausalLM --arch 'torch.nn.LSTM (3 layers, dropout)'
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "inference_sweep.json"
TOLERANCE = 0.02


def check_one(name: str) -> dict[str, Any]:
    """One architecture's record: built, measured for real, predicted."""
    import memlayout.activations as act
    from benchmarks.accuracy.zoo.check import (
        memlayout_error,
        one_line,
        seed_other_generators,
        sweep_start,
    )
    from tests.activations.measure import allocator_inference_peak

    arch, built, record = sweep_start(name)
    if built is None:
        return record
    try:
        seed_other_generators()
        measured = allocator_inference_peak(built.model, tuple(built.args), dict(built.kwargs))
    except Exception as exc:
        return record | {"status": "unsupported", "reason": f"the real forward fails: {one_line(exc)}"[:300]}
    built = arch.build()
    try:
        predicted = act.analyze(built.model, list(built.args), kwargs=built.kwargs, step="inference").summary.peak_bytes
    except Exception as exc:
        return record | {"status": "failed", "measured_peak_bytes": measured,
                         "reason": f"no prediction: {memlayout_error(exc)}"[:300]}
    return record | {"measured_peak_bytes": measured, "predicted_peak_bytes": predicted,
                     "ratio": round(predicted / measured, 4),
                     "within_2pct": abs(predicted - measured) <= TOLERANCE * measured}


def run_child(name: str, timeout: float) -> dict[str, Any]:
    """`check_one` in a fresh process (benchmarks/accuracy/zoo/check.py's `run_check_in_child`)."""
    from benchmarks.accuracy.zoo.check import run_check_in_child

    return run_check_in_child("benchmarks.accuracy.inference_sweep", name, timeout)


def main(argv: list[str]) -> int:
    from benchmarks.accuracy.zoo.check import drawn, sweep_parser

    options = sweep_parser("benchmarks.accuracy.inference_sweep", __doc__.splitlines()[0],
                           timeout=300.0).parse_args(argv)
    if options.one:
        print(json.dumps(check_one(options.one)))
        return 0
    from benchmarks.accuracy.zoo.catalog import by_name

    names = drawn(lambda: sorted(by_name()), options)
    started = time.perf_counter()
    with ThreadPoolExecutor(options.jobs) as pool:
        records = list(pool.map(lambda name: run_child(name, options.timeout), names))
    from benchmarks.accuracy.zoo.run import versions

    runnable = [r for r in records if r["status"] != "unsupported"]
    within = [r for r in runnable if r.get("within_2pct")]
    for record in records:
        ratio = f"{record['ratio']:.4f}" if "ratio" in record else "-"
        print(f"{record['architecture']}: {record['status']}, predicted/measured {ratio} {record.get('reason', '')}")
    print(f"within 2% of the allocator's peak: {len(within)} of {len(runnable)} runnable ({len(records)} drawn)")
    result = {"command": shlex.join(["python", "-m", "benchmarks.accuracy.inference_sweep", *argv]),
              "versions": versions(),
              "wall_seconds": round(time.perf_counter() - started, 1), "architectures": len(records),
              "runnable": len(runnable), "within_2pct": len(within), "records": records}
    from memlayout.io.atomic_write import write_text

    write_text(str(RESULTS), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
