"""Every input that once broke a fuzz figure still ends as recorded, quickly, executing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.replay import manifest
from tests.fuzz.harness import RSS_LIMIT_MIB, SLOW_SECONDS

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def replayed() -> dict[str, dict[str, Any]]:
    result = subprocess.run([sys.executable, "-m", "tests.corpus.replay"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {row["name"]: row for row in rows}


@pytest.mark.parametrize("name", sorted(manifest()))
def test_regression_input_ends_as_recorded(replayed: dict[str, dict[str, Any]], name: str) -> None:
    entry, row = manifest()[name], replayed[name]
    for outcome in row["outcomes"]:  # metadata only, then --deep
        assert outcome["outcome"] == entry["expect"], (entry["broke"], outcome)
        assert entry["contains"] in outcome["message"], (entry["broke"], outcome)
        assert not outcome["memory_error"], f"an allocation failed: {entry['broke']}"
    assert row["seconds"] < SLOW_SECONDS
    assert row["executions"] == []
    assert row["violations"] == [], "what was read is impossible"
    assert row["read_rss_mib"] < RSS_LIMIT_MIB


def test_the_manifest_names_every_file_and_only_them() -> None:
    folder = REPO_ROOT / "tests" / "corpus" / "regressions"
    assert sorted(p.name for p in folder.glob("*.bin")) == sorted(manifest())


def test_the_deep_scan_of_overlapping_views_counts_as_torch_does(tmp_path: Path) -> None:
    # The fix for the zero-stride hang counts each distinct element once and
    # multiplies by the repeats; torch's own count is the reference.
    import torch

    import memlayout
    from memlayout.rules import RuleConfig

    expanded = torch.tensor([1.0, float("nan"), 3.0]).expand(1000, 3)
    scalar = torch.tensor(float("inf")).expand(7, 5)
    torch.save({"expanded": expanded, "scalar": scalar}, tmp_path / "views.pt")
    report = memlayout.inspect(str(tmp_path / "views.pt"), config=RuleConfig(deep=True))
    messages = sorted(f.message for f in report.findings if f.code == "ML503")
    expected = {name: int((~torch.isfinite(t)).sum()) for name, t in (("expanded", expanded), ("scalar", scalar))}
    assert messages == [f"expanded has {expected['expanded']} NaN/Inf values of 3000",
                        f"scalar has {expected['scalar']} NaN/Inf values of 35"]
