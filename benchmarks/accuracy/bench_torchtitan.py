"""torchtitan's published Table 1 figure, predicted without a GPU: Llama 3.1 8B, FSDP over 8 H100 96GB.

pytorch/torchtitan `benchmarks/llama3_h100_202412_torchtitan.md`, Table 1 (torchtitan
9dec370, torch 1963fc8, December 2024): Llama 3.1 8B, 8 GPUs, FSDP, local batch 2 at
8,192 tokens, selective (op) activation checkpointing, no torch.compile, no Float8:
82.4 GiB per GPU, torchtitan's `memory/max_reserved(GiB)` (`torch.cuda.max_memory_reserved()`,
read at step 90 over the last 10 steps). The H100s have 96GB of HBM2e.

What `memlayout activations` is given is torchtitan's own step: its model and its
selective checkpointing (`torchtitan_llama:llama3_8b`, imported from the torchtitan
package), and its recipe as flags: FSDP2 on each block, then the root
(`--fsdp-modules 'model.layers.*'`), the last block kept gathered
(`--reshard-after-forward torchtitan`), bf16 parameters reduced in float32
(torchtitan's `mixed_precision_param`/`_reduce` defaults), AdamW with `foreach=True`
and `clip_grad_norm_(max_norm=1.0, foreach=True)` (its `build_optimizers` and train
step), traced for `--gpu h100-96gb`. The command runs twice, with the caching
allocator's default settings and with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
(torchtitan's `run_llama_train.sh` sets it; the table does not say which launcher ran),
each timed with its own peak RSS; the report's reserved peak is compared with 82.4 GiB,
and each term of the peak is printed.

Fake CUDA tensors: torch's CUDA build (no GPU) or a build the fake CUDA device works on.

Usage: python benchmarks/accuracy/bench_torchtitan.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from harness import Row, print_table, write_results  # noqa: E402

GIB = 2**30
PUBLISHED_GIB = 82.4
WITHIN = 0.05
TOKENS = "int64[2,8192]<128256"
FLAGS = [
    "torchtitan_llama:llama3_8b", "--input", TOKENS, "--input", TOKENS, "--world-size", "8", "--fsdp",
    "--fsdp-modules", "model.layers.*", "--reshard-after-forward", "torchtitan", "--param-dtype", "bf16",
    "--reduce-dtype", "fp32", "--optimizer-impl", "foreach", "--clip-grad-norm", "1.0", "--clip-grad-impl",
    "foreach", "--gpu", "h100-96gb",
]
COMMAND = "memlayout activations " + " ".join(f"'{a}'" if "*" in a or "<" in a else a for a in FLAGS)
SETTINGS = {"default": {}, "expandable segments": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}


def run(extra_env: dict[str, str]) -> dict[str, Any]:
    """The command in a process of its own, timed, its peak RSS measured (measure_child.py); its JSON report."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        command = [sys.executable, "-m", "memlayout", "activations", *FLAGS, "--format", "json", "-o", str(out)]
        env = dict(os.environ, **extra_env, TRANSFORMERS_VERBOSITY="error",
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks" / "accuracy"),
                                               os.environ.get("PYTHONPATH", "")]))
        child = str(ROOT / "benchmarks" / "speed" / "measure_child.py")
        measured = json.loads(subprocess.run([sys.executable, child, *command],
                                             capture_output=True, text=True, check=True, env=env).stdout)
        if measured["exit"] != 0:
            failed = subprocess.run(command, capture_output=True, text=True, env=env)
            raise SystemExit(f"{COMMAND} failed: {failed.stderr.strip()[-2000:]}")
        return {"measured": measured, "report": json.loads(out.read_text())}


def terms(report: dict[str, Any]) -> dict[str, int]:
    """The largest rank's figures, term by term: FSDPMemTracker's kinds at the peak, what the allocator adds."""
    rank = next(r for r in report["ranks"] if r["rank"] == report["summary"]["rank"])
    tracker = rank["tracker"]
    return {
        "sharded parameters (float32)": tracker.get("Sharded Param", 0),
        "gathered parameters (bf16: the root, the last block)": tracker.get("Unsharded Param", 0),
        "optimizer state (AdamW, float32)": tracker.get("OptState", 0),
        "gradients": tracker.get("Sharded Grad", 0) + tracker.get("Unsharded Grad", 0),
        "saved activations (op-level checkpointing)": tracker.get("Activation", 0),
        "backward's temporaries (the loss's float32 logits and their gradient)": tracker.get("Temp", 0),
        "all-gather and reduce-scatter buffers": tracker.get("All Gather", 0) + tracker.get("Reduce Scatter", 0),
        "inputs and buffers": tracker.get("Inputs", 0) + tracker.get("Buffer", 0),
        "= peak of live tensors (FSDPMemTracker)": rank["peak_bytes"],
        "+ blocks rounded and kept whole (max_memory_allocated less the tensors)":
            rank["allocator_peak_bytes"] - rank["peak_bytes"],
        "+ cached free blocks in the segments (fragmentation, a pool per stream)":
            rank["reserved_peak_bytes"] - rank["allocator_peak_bytes"],
        "= the step's reserved peak": rank["reserved_peak_bytes"],
        "+ cuBLAS's workspaces' segments (the caching allocator's too)": report["card"]["workspace_reserved_bytes"],
        "= max_memory_reserved(), torchtitan's figure": rank["reserved_peak_bytes"]
        + report["card"]["workspace_reserved_bytes"],
    }


def versions() -> dict[str, str]:
    """torch's and torchtitan's versions this run used (the table's: torch 1963fc8, torchtitan 9dec370)."""
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "torchtitan")}


def main(argv: list[str]) -> int:
    del argv
    rows: list[Row] = []
    raw: dict[str, Any] = {"command": COMMAND, "published_gib": PUBLISHED_GIB, "versions": versions()}
    for name, env in SETTINGS.items():
        result = run(env)
        report, measured = result["report"], result["measured"]
        reserved = report["summary"]["reserved_peak_bytes"] + report["card"]["workspace_reserved_bytes"]
        raw[name] = {"terms": terms(report), "seconds": measured["seconds"], "max_rss_mib": measured["max_rss_mib"],
                     "reserved_by_stream": next(r for r in report["ranks"] if r["rank"] == report["summary"]["rank"])
                     ["reserved_by_stream"], "card": report.get("card"), "env": env}
        ratio = reserved / GIB / PUBLISHED_GIB
        rows.append(Row(f"Llama 3.1 8B, FSDP over 8 H100 96GB, 2x8192, op-level AC ({name}): reserved per rank",
                        f"{reserved / GIB:.2f} GiB", f"torchtitan's Table 1: {PUBLISHED_GIB} GiB max reserved", ratio,
                        f"within {WITHIN:.0%}", abs(ratio - 1) <= WITHIN))
        rows.append(Row(f"  ({name}) the command's wall time", f"{measured['seconds']:.1f} s", "(info)", 1.0, "(info)",
                        True))
        rows.append(Row(f"  ({name}) the command's peak RSS", f"{measured['max_rss_mib']:.0f} MiB", "limit 2048 MiB",
                        measured["max_rss_mib"] / 2048, "< 1.00x", measured["max_rss_mib"] < 2048))
    print_table("torchtitan's Table 1, predicted on fake CUDA ranks (no GPU)", rows)
    for name in SETTINGS:
        print(f"\n{name}: the largest rank's terms")
        for term, value in raw[name]["terms"].items():
            print(f"  {term:<86} {value / GIB:8.2f} GiB")
    print(f"\ncommand: {COMMAND}  (and with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    print(f"versions: {raw['versions']}")
    write_results("torchtitan", rows, raw, quick=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
