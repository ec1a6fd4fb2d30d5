"""A slice of `make fuzz`: every target, a few dozen mutated inputs each, the same four figures and the properties."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.harness import RSS_LIMIT_MIB
from tests.fuzz.targets import TARGETS

REPO_ROOT = Path(__file__).resolve().parents[2]
SLICE = 40


def assert_figures(summary: dict[str, object], inputs: int) -> None:
    assert summary["inputs"] == inputs, summary
    assert summary["tracebacks"] == 0, summary["failures"]
    assert summary["slow_inputs"] == 0, summary["failures"]
    assert summary["executions"] == 0, summary["failures"]
    assert summary["property_violations"] == 0, summary["failures"]
    assert summary["over_rss_inputs"] == 0 and summary["read_rss_mib"] < RSS_LIMIT_MIB, summary  # type: ignore[operator]


def test_every_target_survives_a_slice_of_mutations(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "tests.fuzz.harness", "all", "--engine", "hypothesis", "--runs", str(SLICE),
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, check=True, timeout=600, capture_output=True,
    )
    for name, target in TARGETS.items():
        summary = json.loads((tmp_path / f"{name}.summary.json").read_text())
        # The seeds first, then the mutations.
        assert_figures(summary, SLICE + len(target.seeds("memlayout-canary-x")))


def test_the_atheris_engine_runs_and_keeps_the_figures(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    subprocess.run(
        [sys.executable, "-m", "tests.fuzz.harness", "torch-pickle", "--engine", "atheris", "--runs", "300",
         "--out", str(tmp_path)],
        cwd=REPO_ROOT, check=True, timeout=600, capture_output=True,
    )
    assert_figures(json.loads((tmp_path / "torch-pickle.summary.json").read_text()), 300)


def test_the_canary_fires_when_a_payload_really_runs(tmp_path: Path) -> None:
    # The detector itself: real pickle.loads of a payload seed must trip it.
    code = f"""
import pickle, sys
from tests.fuzz.harness import Canary
canary = Canary({str(tmp_path / 'memlayout-canary-proof')!r})
payload = [s for s in __import__('tests.fuzz.targets', fromlist=['x']).TARGETS['dcp-metadata'].seeds(canary.path)][1]
try:
    pickle.loads(payload)
except Exception:
    pass
print(sorted(set(canary.check())))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() not in ("", "[]"), "the canary did not see a payload that ran"
