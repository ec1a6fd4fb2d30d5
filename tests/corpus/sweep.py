"""Run `memlayout inspect` over a folder of samples others labelled, watched, and say what it made of each.

Used by tests/corpus/test_scanner_samples.py (samples remade here from recipes) and
benchmarks/speed/bench_scanner_corpora.py (the scanners' own files, from a mirror).

The inspection runs in a child process with an audit hook (PEP 578) that records,
and blocks, every event by which a sample's payload would act: a command, a
process, a connection, a native library, and any global resolved for real by an
unpickler (`pickle.find_class`: memlayout's resolves none, so a run that unpickled
anything for real shows it). A sample that executed anything leaves its event in
`executions`.

Each sample ends as one of:
- "runs-code": ML601 as an error (some global it names runs code or reaches the system);
- "constructs-object": ML601 as a warning (every refused global only builds an object);
- "cleared": read, and no ML601;
- "refused": one error line (damaged, not a format memlayout reads, a cap reached).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]

FLAGGED = ("runs-code", "constructs-object")

_DRIVER = r"""
import json, sys
WATCHED = {"os.system", "subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.kill",
           "socket.connect", "socket.getaddrinfo", "ctypes.dlopen", "webbrowser.open", "urllib.Request",
           "pty.spawn", "pickle.find_class", "shutil.rmtree"}
# torch loads its own libraries through ctypes when imported: before the hook, not from a sample.
import torch, numpy, joblib  # noqa
executions = []
def hook(event, args):
    if event in WATCHED or event.startswith(("os.exec", "os.spawn")):
        executions.append(event)
        raise RuntimeError(f"blocked {event}")
sys.addaudithook(hook)
from memlayout.cli.app import main
code = main(["inspect", *sys.argv[1:], "--format", "json", "--isolated", "--jobs", "1"])
print("SWEEP " + json.dumps({"code": code, "executions": executions}), file=sys.stderr)
"""


class Outcome(NamedTuple):
    """What inspect made of one sample."""

    outcome: str
    """runs-code, constructs-object, cleared or refused."""
    detail: str
    """The refused globals of ML601, or the error line."""


class Sweep(NamedTuple):
    """One watched run over many samples."""

    outcomes: dict[str, Outcome]
    """By file name."""
    executions: list[str]
    """Events by which something from a sample would have acted; empty when nothing ran."""
    exit_code: int


def classify(entry: dict[str, Any]) -> Outcome:
    """One entry of a schema-2 report's `reports`."""
    report = entry["report"]
    if report is None:
        # A pickle that breaks off after naming globals is refused (exit 2), with those globals
        # judged: what unpickling would have imported, and may have called, before it failed.
        named = entry.get("globals") or []
        if named:
            worst = "runs-code" if any(g["danger"] == "runs-code" for g in named) else "constructs-object"
            return Outcome(worst, "damaged, after naming " + ", ".join(f"{g['module']}.{g['name']}" for g in named))
        return Outcome("refused", entry["error"] or entry.get("data") or "")
    for finding in report["findings"]:
        if finding["code"] == "ML601":
            refused = sorted(f"{g['module']}.{g['name']}" for g in finding["globals"] if g["danger"] != "allow-listed")
            return Outcome("runs-code" if finding["severity"] == "error" else "constructs-object", ", ".join(refused))
    return Outcome("cleared", "")


def sweep(paths: list[Path], cwd: Path) -> Sweep:
    """`memlayout inspect PATHS --format json` in a watched child process."""
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, *map(str, paths)], capture_output=True, text=True, timeout=1800, cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL, check=False,
    )
    status = [line for line in done.stderr.splitlines() if line.startswith("SWEEP ")]
    assert status, done.stderr[-3000:]
    watched = json.loads(status[-1].removeprefix("SWEEP "))
    batch = json.loads(done.stdout)
    entries = (batch["reports"] if batch.get("schema") == 2
               else [{"path": str(paths[0]), "report": batch, "error": None}])
    outcomes = {Path(entry["path"]).name: classify(entry) for entry in entries}
    return Sweep(outcomes, watched["executions"], watched["code"])
