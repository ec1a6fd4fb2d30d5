"""CPU figures for `memlayout flatten --to safetensors` against the usual conversion.

Usage: python benchmarks/speed/bench_convert.py [--size-mib 512] [--tensors 256] [--repeat 3] [--quick]

Each a fresh process, file to file, in round-robin rounds (best of --repeat):
  - `memlayout flatten IN -o OUT --to safetensors`: verified and fsynced, the pickle never run;
  - the peer, what safetensors' convert.py does for a state dict: `torch.load(IN,
    weights_only=True)` then `safetensors.torch.save_file(state, OUT, metadata={"format": "pt"})`
    (no verification, no fsync).
Peak RSS of each (GNU time's maximum resident set) is printed beside its time.

Prints a ratio table and writes it, with the raw numbers, to benchmarks/results/convert.json
(--quick: 64 MiB, one round, convert-quick.json). The checkpoint is generated once
into .bench-data/ (gitignored).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import ROOT, Row, print_table, quick_requested, write_results

DATA = ROOT / ".bench-data"

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
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    quick = quick_requested(sys.argv) or args.quick
    size, repeat = (64, 1) if quick else (args.size_mib, args.repeat)
    source = checkpoint(size, args.tensors)
    out = DATA / "converted.safetensors"
    peer = "torch.load + save_file"
    runs: dict[str, list[tuple[float, int]]] = {"memlayout": [], peer: []}
    for _ in range(repeat):
        out.unlink(missing_ok=True)
        runs["memlayout"].append(timed([sys.executable, "-m", "memlayout.cli.app", "flatten", str(source), "-o",
                                        str(out), "--to", "safetensors"]))
        out.unlink(missing_ok=True)
        runs[peer].append(timed([sys.executable, "-c", PEER, str(source), str(out)]))
    out.unlink(missing_ok=True)
    seconds = {name: min(s for s, _ in values) for name, values in runs.items()}
    peak = {name: max(m for _, m in values) / (1 << 20) for name, values in runs.items()}
    rows = [
        Row(f"`memlayout flatten IN -o OUT --to safetensors`, {size} MiB, verified and fsynced",
            f"{seconds['memlayout']:.2f} s", f"{peer} {seconds[peer]:.2f} s",
            seconds["memlayout"] / seconds[peer], "(no goal: the peer neither verifies nor fsyncs)", True),
        Row(f"peak RSS of the conversion, {size} MiB", f"{peak['memlayout']:.0f} MiB",
            f"{peer} {peak[peer]:.0f} MiB", peak["memlayout"] / peak[peer], "<= 1.0x",
            peak["memlayout"] <= peak[peer]),
    ]
    print_table(f"conversion to safetensors, {size} MiB in {args.tensors} tensors, best of {repeat}", rows)
    write_results("convert", rows, {"size_mib": size, "tensors": args.tensors, "runs": runs,
                                    "load_average": os.getloadavg()}, quick)


if __name__ == "__main__":
    main()
