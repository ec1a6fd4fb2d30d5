"""`memlayout activations --fit`: the largest batch of Llama-7B at 4k tokens that fits an H100, and its cost.

The goals: `--fit` on Llama-7B at 4,096 tokens for an H100 takes under 60 s and
2 GiB of RSS on this machine, and under 3x the CPU time of one plain prediction. The model is the Llama-architecture 7B
config in benchmarks/configs/llama-7b, in pure bf16 (`--dtype bf16`) with AdamW,
the step users run to train it on one GPU, traced for an H100 (`--gpu h100`): the
budget is the H100's memory as torch reports it, against the caching allocator's
reserved peak plus the CUDA context, cuBLAS and its workspaces (budget.py's
`card_budget`). Tracing for a GPU needs a torch built with CUDA (no GPU needed):
run it with such a torch (the 2.14.1+cu130 of the torch matrix).

The peer, in the same run: one plain prediction of the same model and inputs
(`memlayout activations` without --fit), so the ratio is the price of the search
in predictions; the count of probes (fake traces of the step at one size) is
printed beside it. Each runs in a child process of its own, which reports its
own peak RSS (VmHWM). `--quick` uses 2 layers of the same width.

Usage: python benchmarks/accuracy/bench_fit.py [--quick]   (with a CUDA build of torch)
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

GIB = 2**30
GPU = "h100"
LENGTH = 4096
CONFIG = ROOT / "benchmarks" / "configs" / "llama-7b"
INPUTS = [f"int64[1,{LENGTH}]<32000", f"labels=int64[1,{LENGTH}]<32000"]


def _target(layers: int, directory: str) -> str:
    if layers == 32:
        return str(CONFIG)
    config = json.loads((CONFIG / "config.json").read_text())
    config["num_hidden_layers"] = layers
    Path(directory, "config.json").write_text(json.dumps(config))
    return directory


traces = [0]
"""Traces of the step (StepWorld.trace, the warm-up step not included), counted in the child."""


def _count_traces() -> None:
    from memlayout.activations.trace.world import StepWorld

    original = StepWorld.trace

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        traces[0] += 1
        return original(self, *args, **kwargs)

    StepWorld.trace = counted  # type: ignore[method-assign]


def child_fit(layers: int) -> dict[str, Any]:
    import tempfile

    start, cpu = time.perf_counter(), time.process_time()
    _count_traces()
    from memlayout.activations.fit.size_search import fit

    with tempfile.TemporaryDirectory() as directory:
        report = fit(_target(layers, directory), INPUTS, gpu=GPU, dtype="bf16")
    planned = report.with_plan
    assert planned is not None
    return {
        "without_plan": report.without_plan.size, "without_plan_peak_bytes": report.without_plan.peak_bytes,
        "without_plan_next_peak_bytes": report.without_plan.next_peak_bytes,
        "with_plan": planned.size, "with_plan_peak_bytes": planned.peak_bytes,
        "with_plan_next_peak_bytes": planned.next_peak_bytes,
        "plan_checkpoints": len(planned.plan.plan.checkpoint) if planned.plan is not None else 0,  # type: ignore[union-attr]
        "budget_bytes": report.budget_bytes, "traces": traces[0],
        "probes": len(report.probes), "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu,
    }


def child_predict(layers: int) -> dict[str, Any]:
    import tempfile

    start, cpu = time.perf_counter(), time.process_time()
    _count_traces()
    import memlayout.activations as act

    with tempfile.TemporaryDirectory() as directory:
        report = act.analyze(_target(layers, directory), INPUTS, dtype="bf16", gpu=GPU)
    return {"peak_bytes": report.summary.peak_bytes, "traces": traces[0], "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu}


CHILDREN = {"fit": child_fit, "predict": child_predict}


def peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM), not getrusage's, which Linux carries over exec from the parent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def in_child(name: str, layers: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", name, str(layers)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"child {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gb(count: float) -> str:
    return f"{count / 1e9:.2f} GB"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        result = CHILDREN[argv[1]](int(argv[2]))
        result["max_rss_bytes"] = peak_rss_bytes()
        print(json.dumps(result))
        return 0
    quick = quick_requested(argv)
    layers = 2 if quick else 32
    label = f"Llama {layers} layers x 4096, bf16 + AdamW, 1x{LENGTH} tokens, --gpu {GPU}"
    peer = in_child("predict", layers)
    ours = in_child("fit", layers)
    limit = 60.0
    rows = [
        Row(f"{label}: --fit wall time", f"{ours['seconds']:.1f} s", f"limit {limit:.0f} s", ours["seconds"] / limit,
            "< 1.00x", ours["seconds"] < limit),
        Row(f"{label}: --fit CPU time", f"{ours['cpu_seconds']:.1f} s",
            f"one plain prediction {peer['cpu_seconds']:.1f} s", ours["cpu_seconds"] / peer["cpu_seconds"],
            f"< 3.00x ({ours['probes']} probes, {ours['traces']} traces against {peer['traces']})",
            ours["cpu_seconds"] < 3 * peer["cpu_seconds"]),
        Row(f"{label}: --fit peak RSS", f"{ours['max_rss_bytes'] / 2**20:.1f} MiB", "limit 2048.0 MiB",
            ours["max_rss_bytes"] / (2 * GIB), "< 1.00x", ours["max_rss_bytes"] < 2 * GIB),
        Row(f"{label}: batch, no plan", str(ours["without_plan"]),
            f"peak {gb(ours['without_plan_peak_bytes'] or 0)}; one more "
            f"{gb(ours['without_plan_next_peak_bytes'] or 0)}",
            (ours["without_plan_peak_bytes"] or 0) / ours["budget_bytes"], "(info: <= 1.00x of the budget)", True),
        Row(f"{label}: batch, with the plan", str(ours["with_plan"]),
            f"peak {gb(ours['with_plan_peak_bytes'] or 0)}; one more {gb(ours['with_plan_next_peak_bytes'] or 0)}",
            (ours["with_plan_peak_bytes"] or 0) / ours["budget_bytes"],
            f"(info: {ours['plan_checkpoints']} modules checkpointed)",
            True),
    ]
    print_table("memlayout activations --fit: the search's cost against one prediction, and the goals", rows)
    write_results("bench_fit", rows, {"layers": layers, "gpu": GPU, "budget_bytes": ours["budget_bytes"], "fit": ours,
                                      "predict": peer}, quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
