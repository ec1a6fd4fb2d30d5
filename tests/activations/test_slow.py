"""The memory goals at full size (issue 13), run by `make slow`, not by `make test`.

Each prediction runs in its own process so that its peak RSS is its own. Times
are measured in benchmarks/accuracy/bench_activations.py, never asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("MEMLAYOUT_SLOW") != "1", reason="full-size goals: run `make slow`"),
]


def child(name: str, *args: int) -> dict[str, Any]:
    script = ROOT / "benchmarks" / "accuracy" / "bench_activations.py"
    command = [sys.executable, str(script), "--child", name, *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_gpt2_64x512_is_predicted_within_2_percent_in_under_1_gib() -> None:
    predicted = child("gpt2-predict", 64, 512)
    real = child("gpt2-real", 64, 512)
    assert real["peak_bytes"] > 3 * GIB
    assert abs(predicted["peak_bytes"] - real["peak_bytes"]) <= 0.02 * real["peak_bytes"]
    assert predicted["max_rss_bytes"] < GIB


def test_llama_7b_at_4096_tokens_is_predicted_in_under_2_gib() -> None:
    ours = child("llama-memlayout", 32, 4096)
    assert ours["parameter_bytes"] > 6.5e9 * 4  # a 7B-parameter model in float32
    assert ours["max_rss_bytes"] < 2 * GIB
    peer = child("llama-memtracker", 32, 4096)
    assert abs(ours["peak_bytes"] - peer["peak_bytes"]) <= 0.02 * peer["peak_bytes"]
