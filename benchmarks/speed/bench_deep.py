"""`inspect --deep` throughput against the machine's copy bandwidth, and its peak memory.

Usage: python benchmarks/speed/bench_deep.py [--quick]

- Bandwidth: `memlayout.inspect(path, config=RuleConfig(deep=True))` on the 1 GiB
  checkpoint (every value checked for NaN/Inf, ML102 candidates compared in full),
  as GB/s of tensor bytes, against `dst.copy_(src)` of the same byte count between
  two in-memory torch tensors (torch's own threads, the machine's practical memory
  bandwidth). The deep figure includes the metadata inspection and reading through
  the page cache, so it is what a user sees with a warm cache.
- Ceiling: the same file pread in 4 MiB pieces on as many threads as the scan
  uses, computing nothing: no scan of the file can beat it, and on a VM it sits
  well below the copy figure.
- Start-up is left out of both figures: the deep run is timed in a subprocess after
  one metadata inspection there (imports, first-call costs), the copy after one
  untimed copy.
- Memory: the deep run happens in a subprocess that polls its own RSS
  (/proc/self/statm) every 2 ms; growth over its RSS just before the run is compared
  with the promise: the largest tensor plus 64 MiB.

Best of N, in round-robin rounds with the copy, so that drift hits both alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import ROOT, Row, print_table, quick_requested, write_results
from harness.checkpoints import MIB, checkpoint

# One deep run per round in a fresh process (benchmarks/speed/deep_rss_probe.py): RSS polled
# from a thread, the run timed in-process (interpreter start-up and imports excluded,
# as for the copy).
_PROBE = Path(__file__).resolve().parent / "deep_rss_probe.py"


def deep_run(path: Path) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(_PROBE), str(path)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    measured: dict[str, Any] = json.loads(result.stdout)
    return measured


def copy_seconds(nbytes: int, repeat: int) -> float:
    import torch

    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault both in before timing
    best = float("inf")
    import time

    for _ in range(repeat):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return best


def read_ceiling_seconds(path: Path, threads: int, repeat: int) -> float:
    """Best time to pread the whole file in 4 MiB pieces on `threads` threads, computing nothing.

    The fastest any scan of the file can go: every byte has to come out of the page
    cache, and on VMs that costs far more than a copy between two anonymous buffers.
    """
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    chunk = 4 * MIB
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    buffers = [bytearray(chunk) for _ in range(threads)]

    def part(index: int) -> None:
        for offset in range(index * chunk, size, threads * chunk):
            os.preadv(fd, [buffers[index]], offset)

    best = float("inf")
    try:
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(repeat):
                start = time.perf_counter()
                list(pool.map(part, range(threads)))
                best = min(best, time.perf_counter() - start)
    finally:
        os.close(fd)
    return best


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = quick_requested(argv)
    ckpt = checkpoint("40MiB", 40 * MIB) if quick else checkpoint("1GiB", 1024 * MIB)
    with open(ckpt.torch_path, "rb") as handle:  # warm the page cache
        while handle.read(64 * MIB):
            pass
    rounds = 3 if quick else 5
    deep_runs: list[dict[str, Any]] = []
    copies: list[float] = []
    reads: list[float] = []
    threads = min(4, os.cpu_count() or 1)
    for _ in range(rounds):
        deep_runs.append(deep_run(ckpt.torch_path))
        copies.append(copy_seconds(ckpt.nbytes, 3))
        reads.append(read_ceiling_seconds(ckpt.torch_path, threads, 2))
    nbytes = deep_runs[0]["bytes"]
    deep_best = min(r["seconds"] for r in deep_runs)
    copy_best = min(copies)
    deep_rate, copy_rate = nbytes / deep_best / 1e9, nbytes / copy_best / 1e9
    read_rate = ckpt.torch_path.stat().st_size / min(reads) / 1e9
    growth = max(r["growth"] for r in deep_runs)
    bound = deep_runs[0]["largest"] + 64 * MIB
    # A quick run's file is too small for throughput to mean much (the fixed
    # metadata cost dominates), so its ratio is shown but not judged.
    rows = [
        Row(f"--deep scan GB/s ({ckpt.label}, 400 tensors)", f"{deep_rate:.2f} GB/s",
            f"torch copy_ {copy_rate:.2f} GB/s", deep_rate / copy_rate,
            "(full run only)" if quick else ">= 0.5x", quick or deep_rate / copy_rate >= 0.5),
        Row(f"--deep scan GB/s ({ckpt.label})", f"{deep_rate:.2f} GB/s",
            f"page-cache read ceiling ({threads}-thread pread) {read_rate:.2f} GB/s", deep_rate / read_rate,
            "(info)", True),
        Row("page-cache read ceiling", f"{read_rate:.2f} GB/s", f"torch copy_ {copy_rate:.2f} GB/s",
            read_rate / copy_rate, "(info)", True),
        Row(f"--deep peak RSS growth ({ckpt.label})", f"{growth / MIB:.1f} MiB",
            f"largest tensor + 64 MiB = {bound / MIB:.1f} MiB", growth / bound, "<= 1x", growth <= bound),
        Row(f"--deep peak RSS growth vs file ({ckpt.label})", f"{growth / MIB:.1f} MiB",
            f"file {ckpt.torch_path.stat().st_size / MIB:.0f} MiB", growth / ckpt.torch_path.stat().st_size,
            "(info)", True),
    ]
    print_table(f"bench_deep: inspect --deep{' (quick)' if quick else ''}", rows)
    raw = {
        "deep_runs": deep_runs,
        "copy_seconds": copies,
        "read_ceiling_seconds": reads,
        "read_threads": threads,
        "bytes": nbytes,
        "file": str(ckpt.torch_path),
    }
    print(f"raw numbers: {write_results('deep', rows, raw, quick).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
