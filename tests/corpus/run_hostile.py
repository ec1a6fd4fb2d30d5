"""Inspect every hostile file through the CLI entry, in one child process, and report each outcome.

Run in a child with its address space capped, so that a file that breaks the
memory figure fails a test instead of exhausting the machine; the peak RSS after
each file tells which one pushed the peak. Prints one JSON object per file:

    python -m tests.corpus.run_hostile [NAME ...]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ADDRESS_SPACE_LIMIT = 3 << 30


def inspect_one(name: str, folder: Path) -> dict[str, Any]:
    from memlayout.cli.app import main
    from tests.corpus.hostile import BY_NAME
    from tests.fuzz.harness import CANARY_MARK, Canary, peak_rss_mib, read_rss_mib

    hostile = BY_NAME[name]
    canary = _canary(Canary, folder / f"{CANARY_MARK}-{name}")
    built = hostile.build(canary.path)
    target = folder / name
    if isinstance(built, dict):
        target.mkdir()
        for relative, data in built.items():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            (target / relative).write_bytes(data)
    else:
        target.write_bytes(built)
    runs = []
    for extra in ([], ["--deep"]):
        stdout, stderr = io.StringIO(), io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["inspect", str(target), "--format", "json", "--fail-on", "never", *extra])
        seconds = time.perf_counter() - started
        report = json.loads(stdout.getvalue()) if code == 0 and stdout.getvalue() else None
        findings = {f["code"]: f["message"] for f in report["findings"]} if report else {}
        runs.append({
            "deep": bool(extra), "exit_code": code, "stderr": stderr.getvalue(), "ml601": findings.get("ML601"),
            "codes": sorted(findings), "formats": report["source"].get("formats") if report else None,
            "seconds": round(seconds, 3),
        })
    from tests.invariants import violations

    read = any(run["exit_code"] == 0 for run in runs)
    return {
        "name": name, "runs": runs, "executions": canary.check(),
        "violations": violations(str(target)) if read else [],
        "peak_rss_mib": round(peak_rss_mib(), 1), "read_rss_mib": round(read_rss_mib(), 1),
        "escaped": sorted(p.name for p in folder.parent.rglob("escaped")),
    }


_CANARIES: dict[str, Any] = {}


def _canary(factory: Any, path: Path) -> Any:
    # One audit hook per process (hooks cannot be removed); each file gets its own path.
    canary = _CANARIES.get("hook")
    if canary is None:
        canary = _CANARIES["hook"] = factory(str(path))
    canary.path = str(path)
    return canary


def main() -> int:
    from tests.corpus.hostile import HOSTILE
    from tests.fuzz.harness import limit_address_space

    limit_address_space(ADDRESS_SPACE_LIMIT)
    names = sys.argv[1:] or [h.name for h in HOSTILE]
    with tempfile.TemporaryDirectory(prefix="memlayout-hostile-") as parent:
        folder = Path(parent) / "files"
        folder.mkdir()
        for name in names:
            print(json.dumps(inspect_one(name, folder)), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.pop("MEMLAYOUT_PWNED", None)
    sys.exit(main())
