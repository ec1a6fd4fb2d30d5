"""CPU figures for `memlayout flatten --to safetensors` against the usual conversion.

Usage: python benchmarks/bench_convert.py [--size-mib 512] [--tensors 256] [--repeat 3]

Each a fresh process, file to file, in round-robin rounds (best of --repeat):
  - `memlayout flatten IN -o OUT --to safetensors`: verified and fsynced, the pickle never run;
  - the peer, what safetensors' convert.py does for a state dict: `torch.load(IN,
    weights_only=True)` then `safetensors.torch.save_file(state, OUT, metadata={"format": "pt"})`
    (no verification, no fsync).
Peak RSS of each (GNU time's maximum resident set) is printed beside its time.

Writes raw numbers to benchmarks/results/convert.json. The checkpoint is generated
once into .bench-data/ (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".bench-data"
RESULTS = ROOT / "benchmarks" / "results"

PEER = """
import sys, torch
from safetensors.torch import save_file
state = torch.load(sys.argv[1], weights_only=True)
save_file(state, sys.argv[2], metadata={"format": "pt"})
"""


def checkpoint(size_mib: int, tensors: int) -> Path:
    path = DATA / f"convert_{size_mib}mib_{tensors}.pt"
    if not path.exists():
        import torch

        DATA.mkdir(exist_ok=True)
        numel = size_mib * (1 << 20) // 4 // tensors
        generator = torch.Generator().manual_seed(0)
        torch.save({f"layer{i}.weight": torch.randn(numel, generator=generator) for i in range(tensors)}, path)
    return path


def timed(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS in bytes of one fresh process."""
    started = time.perf_counter()
    result = subprocess.run(["/usr/bin/time", "-f", "%M", *command], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - started
    return seconds, int(result.stderr.strip().splitlines()[-1]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    source = checkpoint(args.size_mib, args.tensors)
    out = DATA / "converted.safetensors"
    runs: dict[str, list[tuple[float, int]]] = {"memlayout": [], "torch.load + save_file": []}
    for _ in range(args.repeat):
        out.unlink(missing_ok=True)
        runs["memlayout"].append(timed([sys.executable, "-m", "memlayout.cli.app", "flatten", str(source), "-o",
                                        str(out), "--to", "safetensors"]))
        out.unlink(missing_ok=True)
        runs["torch.load + save_file"].append(timed([sys.executable, "-c", PEER, str(source), str(out)]))
    best = {name: (min(s for s, _ in values), max(m for _, m in values)) for name, values in runs.items()}
    ours, peer = best["memlayout"], best["torch.load + save_file"]
    print(f"{args.size_mib} MiB in {args.tensors} tensors, best of {args.repeat}")
    for name, (seconds, peak) in best.items():
        print(f"  {name:24} {seconds:6.2f} s   peak RSS {peak / (1 << 20):7.0f} MiB")
    print(f"  ratio (memlayout / peer): time {ours[0] / peer[0]:.2f}x, peak RSS {ours[1] / peer[1]:.2f}x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "convert.json").write_text(json.dumps(
        {"size_mib": args.size_mib, "tensors": args.tensors, "runs": runs,
         "load_average": os.getloadavg()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
