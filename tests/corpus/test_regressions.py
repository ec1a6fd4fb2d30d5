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
    assert row["peak_rss_mib"] < RSS_LIMIT_MIB


def test_the_manifest_names_every_file_and_only_them() -> None:
    folder = REPO_ROOT / "tests" / "corpus" / "regressions"
    assert sorted(p.name for p in folder.glob("*.bin")) == sorted(manifest())
