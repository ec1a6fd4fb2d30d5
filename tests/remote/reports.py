"""Running `memlayout inspect` in a process of its own, and comparing a remote report with the disk's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tests.remote.nginx import Server

REPO = Path(__file__).resolve().parents[2]


class Run(NamedTuple):
    code: int
    stdout: str
    stderr: str


def memlayout(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> Run:
    """`python -m memlayout ARGS` in a fresh process, as a user runs it."""
    environment = {**os.environ, **(env or {})}
    if cwd is not None:  # the package must still import from the checkout under test
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environment.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "memlayout", *args], capture_output=True, text=True, timeout=timeout,
        env=environment, cwd=cwd,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def json_report(target: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run = memlayout("inspect", "--format", "json", "--fail-on", "never", *args, target, env=env)
    assert run.code == 0, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def skipped_codes(report: dict[str, Any]) -> list[str]:
    return sorted(entry["code"] for entry in report.get("skipped_rules", []))


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report less what names the place it was read from: the path, the notes, the local walk's data files."""
    out = json.loads(json.dumps(report))
    out["source"].pop("path")
    out["source"]["notes"] = [n for n in out["source"]["notes"] if not n.startswith("read remotely")]
    out.pop("skipped_rules", None)
    # A local model folder's walk lists its other files that are data (generation_config.json); a
    # remote model folder is read by its index and config alone.
    out.pop("data_files", None)
    return out


def same_report_remotely(local: str, url: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Inspect both; assert the reports match apart from the rules skipped remotely; return those."""
    remote = json_report(url, *args, env=env)
    skipped = skipped_codes(remote)
    ignores: Sequence[str] = [flag for code in skipped for flag in ("--ignore", code)]
    on_disk = json_report(local, *args, *ignores)
    remote_again = json_report(url, *args, *ignores, env=env)
    assert comparable(remote_again) == comparable(on_disk)
    return skipped


def served(server: Server, name: str) -> str:
    return f"{server.url}/files/{name}"
