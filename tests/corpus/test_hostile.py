"""Every hostile file of `tests/corpus/hostile.py`: reported as ML601 or refused, never executed.

All files are inspected (metadata, then --deep) in one child process with its
address space capped (`run_hostile.py`); each test here checks one file's outcome.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.hostile import BY_NAME, CLEAN, HOSTILE, ML601, REFUSED
from tests.fuzz.harness import RSS_LIMIT_MIB, SLOW_SECONDS

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    # One run for all test workers: the first to get the lock writes the file.
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent / "hostile-outcomes.jsonl"
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            result = subprocess.run([sys.executable, "-W", "ignore", "-m", "tests.corpus.run_hostile"],
                                    cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            shared.write_text(result.stdout)
    rows = [json.loads(line) for line in shared.read_text().splitlines()]
    return {row["name"]: row for row in rows}


def outcome_of(run: dict[str, Any]) -> str:
    if run["exit_code"] == 2:
        return REFUSED
    assert run["exit_code"] == 0, run  # --fail-on never: findings never set the exit code
    return ML601 if run["ml601"] else CLEAN


@pytest.mark.parametrize("name", [h.name for h in HOSTILE])
def test_hostile_file_is_reported_or_refused_and_runs_nothing(outcomes: dict[str, dict[str, Any]], name: str) -> None:
    hostile, row = BY_NAME[name], outcomes[name]
    assert row["executions"] == [], f"{name} ({hostile.origin}) ran: {row['executions']}"
    assert row["escaped"] == [], "a member name wrote outside the folder"
    assert row["violations"] == [], f"{name}: what was read is impossible"
    assert row["read_rss_mib"] < RSS_LIMIT_MIB
    for run in row["runs"]:
        assert run["seconds"] < SLOW_SECONDS, (name, run)
        outcome = outcome_of(run)
        assert outcome in hostile.outcomes, f"{name} ({hostile.origin}): {outcome}: {run['stderr'] or run['codes']}"
        if outcome == REFUSED:
            lines = run["stderr"].strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("memlayout: error:"), run["stderr"]
            assert "unexpected" not in lines[0], lines[0]
        if outcome == ML601:
            for dotted in hostile.names:
                assert dotted in run["ml601"], (dotted, run["ml601"])
        if hostile.formats and outcome != REFUSED:
            assert run["formats"] == list(hostile.formats)
            assert "ML603" in run["codes"]


def test_every_class_the_issue_names_has_a_file() -> None:
    origins = " ".join(h.name for h in HOSTILE)
    for attack in ("os-system", "subprocess", "eval", "exec", "getattr", "stack-global-from-memo", "torch-lookalike",
                   "persistent-id", "nested-archive", "dot-dot", "absurd", "overlapping", "zip-bomb", "polyglot"):
        assert attack in origins, attack


def test_ordinary_files_are_not_polyglots(tmp_path: Path) -> None:
    # ML603 must not fire on what torch and safetensors write: every seed is clean of it.
    from memlayout.pipeline.inspection import run_inspection
    from tests.corpus.make_seeds import seed_paths

    for name, path in seed_paths().items():
        report = run_inspection(str(path))
        assert "ML603" not in {f.code for f in report.findings}, name
        assert report.facts.source.also_valid_as == (), name
