"""On a GPU: the allocator model's reserved and allocated peaks against `torch.cuda.max_memory_reserved()` and
`max_memory_allocated()`, and cuBLAS's workspaces against what torch allocates for them.

The real step runs in a fresh process (tests/activations/real_reserved.py), so its allocator starts empty as the
model's does. The 1B Llama case needs about 30 GB and a minute or two; it runs with MEMLAYOUT_GPU_LARGE=1
(benchmarks/gpu/gpu_check.sh sets it in a step of its own).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import memlayout.activations as act
from memlayout.activations.device.cuda_runtime import cuda_runtime
from tests.activations.real_reserved import CASES

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROOT = Path(__file__).resolve().parents[3]
LARGE = pytest.mark.skipif(os.environ.get("MEMLAYOUT_GPU_LARGE") != "1",
                           reason="the 1B case runs with MEMLAYOUT_GPU_LARGE=1 (benchmarks/gpu/gpu_check.sh)")


@functools.cache
def real(case: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.activations.real_reserved", case], cwd=ROOT,
                          capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


@pytest.mark.parametrize("case", ["gpt2-tiny-8x128", "llama-small-4x512-autocast",
                                  pytest.param("llama-1b-1x2048-autocast", marks=LARGE)])
def test_predicted_reserved_within_5_percent_of_max_memory_reserved(case: str) -> None:
    build, inputs, autocast = CASES[case]
    measured = real(case)
    report = act.analyze(f"tests.activations.real_reserved:{build.__name__}", [], kwargs=inputs(), device="cuda",
                         autocast=autocast)
    summary = report.summary
    assert summary.reserved_peak_bytes is not None and summary.allocator_peak_bytes is not None
    figures = (f"{case} on {measured['device']}, torch {measured['torch']}: reserved predicted "
               f"{summary.reserved_peak_bytes} measured {measured['max_memory_reserved']}; allocated predicted "
               f"{summary.allocator_peak_bytes} measured {measured['max_memory_allocated']}")
    print(figures)
    assert abs(summary.reserved_peak_bytes / measured["max_memory_reserved"] - 1) <= 0.05, figures
    assert abs(summary.allocator_peak_bytes / measured["max_memory_allocated"] - 1) <= 0.02, figures


def test_cublas_workspaces_are_what_torch_allocates_for_them() -> None:
    measured = real("gpt2-tiny-8x128")
    major, minor = measured["capability"]
    runtime = cuda_runtime((major, minor))
    assert measured["workspaces_allocated"] == runtime.workspace_bytes, measured
