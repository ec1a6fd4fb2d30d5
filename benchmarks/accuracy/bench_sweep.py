"""`memlayout activations --sweep batch=1:8`: eight sizes of Llama-7B at 4k tokens for an H100, and their cost.

The goal: a sweep of 8 sizes takes under 3x the CPU time of one plain prediction of the
same step. The model and settings are bench_fit.py's: the Llama-architecture 7B config
in benchmarks/configs/llama-7b, pure bf16 with AdamW, inputs `int64[1,4096]<32000` and
the same as labels, traced for an H100 (`--gpu h100`, which needs a torch built with
CUDA, no GPU). The sweep is batch 1 to 8.

The peers, in the same run, each in a child process of its own that reports its own
peak RSS (VmHWM):
- one plain prediction at batch 1 (`memlayout activations` without --sweep): the goal's
  measure;
- the same sweep with every size traced, on one built model (the sizes' traces, no
  size laws): what the laws save, and the figures every row must equal, to the byte
  (the peak, the allocated and reserved peaks, the figure compared with the card).

`--quick` uses 2 layers of the same width.

Usage: python benchmarks/accuracy/bench_sweep.py [--quick]   (with a CUDA build of torch)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, print_table, quick_requested, write_results  # noqa: E402

from benchmarks.accuracy.bench_fit import (  # noqa: E402
    CONFIG,
    GPU,
    INPUTS,
    _count_traces,
    _target,
    peak_rss_bytes,
    traces,
)

GIB = 2**30
SWEEP = "batch=1:8"
SIZES = tuple(range(1, 9))


def _figures(summary: Any, compared: int) -> list[int | None]:
    return [summary.peak_bytes, summary.allocator_peak_bytes, summary.reserved_peak_bytes, compared]


def child_sweep(layers: int) -> dict[str, Any]:
    import tempfile

    start, cpu = time.perf_counter(), time.process_time()
    _count_traces()
    from memlayout.activations import StepRequest, predict

    with tempfile.TemporaryDirectory() as directory:
        report = predict(StepRequest(_target(layers, directory), input=tuple(INPUTS), gpu=GPU, dtype="bf16",
                                     sweep=SWEEP))
    return {
        "rows": {row.size: [row.peak_bytes, row.allocator_peak_bytes, row.reserved_peak_bytes, row.compared_bytes]
                 for row in report.rows},
        "traced": list(report.traced_sizes), "evaluated": list(report.evaluated_sizes), "how": report.how,
        "traces": traces[0], "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
    }


def child_traced(layers: int) -> dict[str, Any]:
    """Every size of the sweep traced on one built model, as the sweep builds it."""
    import tempfile

    start, cpu = time.perf_counter(), time.process_time()
    _count_traces()
    from memlayout.activations import StepRequest
    from memlayout.activations.analysis import target_gpu
    from memlayout.activations.budget import card_budget
    from memlayout.activations.fit.size_search import scaled_dims
    from memlayout.activations.fit.sized_step import SizedStep
    from memlayout.activations.model.input_specs import parse_input_spec

    with tempfile.TemporaryDirectory() as directory:
        request = StepRequest(_target(layers, directory), input=tuple(INPUTS), gpu=GPU, dtype="bf16")
        specs = [parse_input_spec(text) for text in INPUTS]
        dims, _ = scaled_dims(specs, "batch")
        sized = SizedStep(request, specs, dims)
        gpu = target_gpu(sized.step)
        assert gpu is not None
        budget = card_budget(gpu)
        rows = {}
        for size in SIZES:
            _, summary = sized.trace(size)
            rows[size] = _figures(summary, budget.judged(summary))
    return {"rows": rows, "traces": traces[0], "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu}


def child_predict(layers: int) -> dict[str, Any]:
    import tempfile

    start, cpu = time.perf_counter(), time.process_time()
    _count_traces()
    import memlayout.activations as act

    with tempfile.TemporaryDirectory() as directory:
        report = act.analyze(_target(layers, directory), INPUTS, dtype="bf16", gpu=GPU)
    return {"peak_bytes": report.summary.peak_bytes, "traces": traces[0], "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu}


CHILDREN = {"sweep": child_sweep, "traced": child_traced, "predict": child_predict}


def in_child(name: str, layers: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, str(layers)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"child {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        result = CHILDREN[argv[1]](int(argv[2]))
        result["max_rss_bytes"] = peak_rss_bytes()
        print(json.dumps(result))
        return 0
    quick = quick_requested(argv)
    layers = 2 if quick else 32
    label = f"Llama {layers} layers x 4096 ({CONFIG.name}), bf16 + AdamW, --gpu {GPU}, --sweep {SWEEP}"
    peer = in_child("predict", layers)
    ours = in_child("sweep", layers)
    every = in_child("traced", layers)
    equal = [size for size in SIZES if ours["rows"][str(size)] == every["rows"][str(size)]]
    rows = [
        Row(f"{label}: CPU time", f"{ours['cpu_seconds']:.1f} s", f"one plain prediction {peer['cpu_seconds']:.1f} s",
            ours["cpu_seconds"] / peer["cpu_seconds"],
            f"< 3.00x ({ours['traces']} traces against {peer['traces']}: traced at {ours['traced']}, evaluated at "
            f"{ours['evaluated']})", ours["cpu_seconds"] < 3 * peer["cpu_seconds"]),
        Row(f"{label}: CPU time", f"{ours['cpu_seconds']:.1f} s",
            f"every size traced on one model {every['cpu_seconds']:.1f} s", ours["cpu_seconds"] / every["cpu_seconds"],
            f"(info: {every['traces']} traces)", True),
        Row(f"{label}: figures", f"{len(equal)} of {len(SIZES)} sizes", "every size traced", len(equal) / len(SIZES),
            "= 1.00x (peak, allocated, reserved, compared: equal to the byte)", len(equal) == len(SIZES)),
        Row(f"{label}: peak RSS", f"{ours['max_rss_bytes'] / 2**20:.1f} MiB", "limit 2048.0 MiB",
            ours["max_rss_bytes"] / (2 * GIB), "< 1.00x", ours["max_rss_bytes"] < 2 * GIB),
    ]
    print_table("memlayout activations --sweep: eight sizes against one prediction, and every size traced", rows)
    write_results("bench_sweep", rows, {"layers": layers, "gpu": GPU, "sweep": ours, "traced": every,
                                        "predict": peer}, quick)
    return 0 if len(equal) == len(SIZES) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
