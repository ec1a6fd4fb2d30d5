"""Run one `--deep` inspection and print, as JSON, its time and how far RSS rose above where it started.

Usage: python benchmarks/speed/deep_rss_probe.py PATH

Shared by `bench_deep.py` (throughput and memory figures) and the perf guard
`tests/perf_guards/test_deep_memory.py` (the bounded-memory promise), so both measure
the same way. RSS is polled from a thread (/proc/self/statm) and again at every
progress step. ru_maxrss is no use here: the kernel updates that high-water mark
lazily, and closing the map at the end of the run drops the pages before it is read.
Mapped file pages count in RSS once touched, so a scan that kept them mapped would
grow by the whole file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy  # noqa: F401  (loaded before the baseline: numpy's own pages are not scan memory)

import memlayout
from memlayout.pipeline.inspection import run_inspection
from memlayout.rules import RuleConfig


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(path: str) -> dict[str, object]:
    # A metadata inspection first: lazy imports and first-call costs are start-up,
    # not scan time, just as a copy's figure leaves out importing torch.
    memlayout.inspect(path)
    before = _rss()
    peak = [before]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], _rss())

    def progress(task: str, finished: int, total: int) -> None:
        peak[0] = max(peak[0], _rss())

    threading.Thread(target=poll, daemon=True).start()
    start = time.perf_counter()
    report = run_inspection(path, config=RuleConfig(deep=True), progress=progress)
    seconds = time.perf_counter() - start
    done.set()
    return {
        "seconds": seconds,
        "growth": peak[0] - before,
        "bytes": report.summary.tensor_bytes,
        "largest": max((t.nbytes for t in report.facts.tensors), default=0),
        "codes": sorted({f.code for f in report.findings}),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
