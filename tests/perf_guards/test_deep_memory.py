"""--deep streams with bounded memory: RSS grows by about one tensor, not by the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

MIB = 1 << 20
TENSOR_MIB = 32
TENSORS = 8

# The child polls its own RSS (/proc/self/statm) from a thread while the deep run
# goes, and again at every progress step. ru_maxrss is no use here: the kernel
# updates that high-water mark lazily, and closing the map at the end of the run
# drops the pages before it is read. Mapped file pages count in RSS once touched,
# so a scan that kept them mapped would grow by the whole file.
_CHILD = """
import json, os, sys, threading
import numpy  # imported up front so that its own pages are not counted as scan memory
import memlayout
from memlayout.inspection import run_inspection
from memlayout.rules import RuleConfig
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * page
before = rss()
peak = [before]
done = threading.Event()
def poll():
    while not done.wait(0.002):
        peak[0] = max(peak[0], rss())
threading.Thread(target=poll, daemon=True).start()
def progress(task, finished, total):
    peak[0] = max(peak[0], rss())
report = run_inspection(sys.argv[1], config=RuleConfig(deep=True), progress=progress)
done.set()
print(json.dumps({"growth": peak[0] - before, "codes": sorted({f.code for f in report.findings})}))
"""


def test_deep_scan_memory_stays_near_one_tensor(tmp_path: Path) -> None:
    path = tmp_path / "big.pt"
    elements = TENSOR_MIB * MIB // 4
    side = int(elements**0.5)
    state = {f"w{i}": torch.randn(side, side) for i in range(TENSORS - 1)}
    state["w_t"] = torch.randn(side, side).t()  # a strided tensor takes the gather path
    state["w0"][3, 5] = float("nan")
    torch.save(state, path)
    del state
    result = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout)
    assert "ML503" in measured["codes"]
    # The promise is ~64 MiB beyond one tensor; the file is 256 MiB, so a scan that
    # kept its pages mapped would grow by far more than this generous bound.
    assert measured["growth"] < (TENSOR_MIB + 96) * MIB, measured
