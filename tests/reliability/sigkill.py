"""SIGKILL `memlayout flatten` at random points and check that nothing is lost or left behind.

Each run starts a real flatten (the CLI entry, forked from a server that has torch
imported, see `forkserver.py`), sleeps a random time drawn over the whole length
of an uninterrupted run, and sends SIGKILL. Then:

- IN is byte-identical to what it was (sha256);
- OUT is absent (if it was), still the old OUT, or complete: byte-identical to what
  an uninterrupted run writes, or else loaded and compared tensor by tensor;
- after the next run's clean-up (`remove_stale_temporaries`, which every write
  does first) the folder holds exactly what it held plus OUT: nothing is left behind.

Three kinds of run, drawn at random: a torch.save file to `-o OUT` (OUT absent or an
old file), the same with `--in-place`, and a Hugging Face folder to `-o OUT` (OUT
absent, or an old folder with a file of the user's, with `--force`).

Runs go on until the asked number of them were killed (a run that finished before
its kill counts apart). `make reliability` makes 200 kills on a 64 MiB checkpoint;
`tests/reliability/test_sigkill.py` makes 20. Usage:

    python -m tests.reliability.sigkill --kills 200 --mib 64 [--seed N] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("file", "in-place", "folder")
REPO_ROOT = Path(__file__).resolve().parents[2]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def folder_hashes(path: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(path.iterdir())}


class ForkServer:
    """The harness's side of `forkserver.py`."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.forkserver"], cwd=REPO_ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )

    def start(self, argv: list[str]) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"argv": argv}) + "\n")
        word, pid = self.process.stdout.readline().split()
        assert word == "started", word
        return int(pid)

    def wait(self, pid: int) -> int:
        """The wait status of child `pid` (reaped only now, so a kill never hits a reused PID)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"wait {pid}\n")
        word, ended, status = self.process.stdout.readline().split()
        assert (word, int(ended)) == ("ended", pid)
        return int(status)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def make_checkpoint(path: Path, mib: int, seed: int) -> None:
    """A torch.save state dict of about `mib` MiB that flatten must rewrite (views of a shared storage)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    side = int((mib * (1 << 20) // 4) ** 0.5)
    base = torch.randn(side, side, generator=generator)
    half = side // 2
    state = {
        "encoder.weight": base[:, :half],  # strided views of one storage: flatten makes them dense
        "decoder.weight": base[:, half:].t(),
        "head.weight": torch.randn(256, 64, generator=generator),
        "head.bias": torch.randn(256, generator=generator),
    }
    torch.save(state, path)


def make_model_folder(path: Path, mib: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    numel = mib * (1 << 20) // 4
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "toy"}))
    # Small first, large last: flatten reorders them, so the output differs from IN.
    save_file({"bias": torch.randn(64, generator=generator),
               "weight": torch.randn(numel // 64, 64, generator=generator)},
              path / "model.safetensors")


@dataclass
class Campaign:
    """Counts of what each kill left, by kind of run and by OUT's state."""

    runs: int = 0
    kills: int = 0
    """Runs that SIGKILL interrupted; the others had finished first."""
    finished_before_kill: int = 0
    input_changed: int = 0
    out_bad: int = 0
    leftovers_after_next_run: int = 0
    named_temporaries_cleaned: int = 0
    states: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def ok(self) -> bool:
        return not (self.input_changed or self.out_bad or self.leftovers_after_next_run or self.failures)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs, "kills": self.kills, "finished_before_kill": self.finished_before_kill,
            "input_changed": self.input_changed, "out_bad": self.out_bad,
            "leftovers_after_next_run": self.leftovers_after_next_run,
            "named_temporaries_cleaned": self.named_temporaries_cleaned,
            "out_states": dict(sorted(self.states.items())), "failures": self.failures[:20],
            "seconds": round(self.seconds, 1),
        }


class Harness:
    def __init__(self, workdir: Path, mib: int, seed: int) -> None:
        self.workdir = workdir
        self.random = random.Random(seed)
        self.server = ForkServer()
        inputs = workdir / "inputs"
        inputs.mkdir(parents=True)
        self.checkpoint = inputs / "in.pt"
        make_checkpoint(self.checkpoint, mib, seed)
        self.old_checkpoint = inputs / "old.pt"
        make_checkpoint(self.old_checkpoint, 1, seed + 1)
        self.folder = inputs / "model"
        make_model_folder(self.folder, mib, seed)
        self.checkpoint_hash = sha256(self.checkpoint)
        self.folder_hash = folder_hashes(self.folder)
        self.reference: dict[str, Any] = {}
        self.duration: dict[str, float] = {}
        for kind in KINDS:
            self._measure(kind)

    def _argv(self, kind: str, area: Path) -> list[str]:
        if kind == "file":
            return ["flatten", str(self.checkpoint), "-o", str(area / "out.pt"), "--device", "cpu"]
        if kind == "in-place":
            return ["flatten", str(area / "work.pt"), "--in-place", "--device", "cpu"]
        return ["flatten", str(self.folder), "-o", str(area / "out"), "--device", "cpu", "--force"]

    def _prepare(self, kind: str, area: Path, old: bool) -> None:
        if area.exists():
            shutil.rmtree(area)
        area.mkdir()
        if kind == "in-place":
            shutil.copyfile(self.checkpoint, area / "work.pt")
        elif kind == "file" and old:
            shutil.copyfile(self.old_checkpoint, area / "out.pt")
        elif kind == "folder" and old:
            (area / "out").mkdir()
            (area / "out" / "notes.txt").write_text("the user's own file")
            (area / "out" / "config.json").write_text("old config")

    def _measure(self, kind: str) -> None:
        # Twice: the first run warms caches; the second is as long as a killed run would be.
        area = self.workdir / f"reference-{kind}"
        for _ in range(2):
            self._prepare(kind, area, old=False)
            started = time.perf_counter()
            pid = self.server.start(self._argv(kind, area))
            status = self.server.wait(pid)
            self.duration[kind] = time.perf_counter() - started
            if status != 0:
                raise RuntimeError(f"the uninterrupted {kind} run failed with wait status {status}")
        if kind == "folder":
            self.reference[kind] = folder_hashes(area / "out")
        else:
            self.reference[kind] = sha256(area / ("work.pt" if kind == "in-place" else "out.pt"))
        self._check_loads_as_input(kind, area)

    def _check_loads_as_input(self, kind: str, area: Path) -> None:
        import torch
        from safetensors.torch import load_file

        if kind == "folder":
            got, want = load_file(area / "out" / "model.safetensors"), load_file(self.folder / "model.safetensors")
        else:
            got = torch.load(area / ("work.pt" if kind == "in-place" else "out.pt"), weights_only=True)
            want = torch.load(self.checkpoint, weights_only=True)
        if got.keys() != want.keys() or not all(torch.equal(got[k], want[k]) for k in want):
            raise RuntimeError(f"the {kind} output does not hold IN's tensors")

    def _out_state(self, kind: str, area: Path, old: bool) -> str:
        """absent / old / complete, or a description of what is wrong."""
        if kind == "folder":
            out = area / "out"
            if not out.exists():
                return "absent" if not old else "old folder lost"
            names = sorted(p.name for p in out.iterdir())
            if old and (out / "notes.txt").read_text() != "the user's own file":
                return "the user's file was lost"
            if old and names == ["config.json", "notes.txt"] and (out / "config.json").read_text() == "old config":
                return "old"
            hashes = {n: h for n, h in folder_hashes(out).items() if n != "notes.txt"}
            if hashes == self.reference[kind]:
                return "complete"
            return f"a mix: {names}"
        out = area / ("work.pt" if kind == "in-place" else "out.pt")
        if not out.exists():
            return "absent" if kind == "file" and not old else "old file lost"
        digest = sha256(out)
        if digest == self.reference[kind]:
            return "complete"
        if kind == "in-place" and digest == self.checkpoint_hash:
            return "old"
        if kind == "file" and old and digest == sha256(self.old_checkpoint):
            return "old"
        try:
            self._check_loads_as_input(kind, area)
        except Exception as exc:
            return f"partial ({type(exc).__name__})"
        return "complete"

    def _kill_delay(self, kind: str) -> float:
        # Half the kills anywhere in a run; half in its last quarter, where OUT is
        # written, verified and renamed into place, the part that must be atomic.
        duration = self.duration[kind]
        if self.random.random() < 0.5:
            return self.random.uniform(0.0, duration)
        return self.random.uniform(0.75 * duration, 1.05 * duration)

    def run_one(self, campaign: Campaign, index: int) -> None:
        kind = self.random.choice(KINDS)
        old = kind != "in-place" and self.random.random() < 0.5
        area = self.workdir / "run"
        self._prepare(kind, area, old)
        before = sorted(os.listdir(area))
        pid = self.server.start(self._argv(kind, area))
        time.sleep(self._kill_delay(kind))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        status = self.server.wait(pid)
        killed = os.WIFSIGNALED(status)
        campaign.runs += 1
        # Runs get faster or slower as the machine's load changes: a run that ended
        # before its kill shows the length of a run is overestimated, and a kill
        # nudges it back up, so kills keep landing inside runs.
        if killed:
            campaign.kills += 1
            self.duration[kind] *= 1.02
        else:
            campaign.finished_before_kill += 1
            self.duration[kind] *= 0.85
            if os.WEXITSTATUS(status) != 0:
                campaign.failures.append(f"run {index} ({kind}) exited {os.WEXITSTATUS(status)} unkilled")
        if sha256(self.checkpoint) != self.checkpoint_hash or folder_hashes(self.folder) != self.folder_hash:
            campaign.input_changed += 1
            campaign.failures.append(f"run {index} ({kind}): IN changed")
        state = self._out_state(kind, area, old)
        campaign.states[f"{kind}: {state}"] += 1
        if state not in ("absent", "old", "complete") or (not killed and state != "complete"):
            campaign.out_bad += 1
            campaign.failures.append(f"run {index} ({kind}, old OUT: {old}): OUT is {state}")
        from memlayout.io.atomic_write import remove_stale_temporaries

        campaign.named_temporaries_cleaned += len(remove_stale_temporaries(str(area)))
        after = sorted(os.listdir(area))
        expected = set(before) | {"out" if kind == "folder" else "out.pt"} if kind != "in-place" else set(before)
        if not set(after) <= expected:
            campaign.leftovers_after_next_run += 1
            campaign.failures.append(f"run {index} ({kind}): left behind {sorted(set(after) - expected)}")

    def close(self) -> None:
        self.server.close()


def run_campaign(workdir: Path, kills: int, mib: int, seed: int) -> Campaign:
    """Flattens of a `mib` MiB checkpoint in `workdir` until `kills` were killed (workdir removed afterwards)."""
    started = time.perf_counter()
    campaign = Campaign()
    harness = Harness(workdir, mib, seed)
    try:
        while campaign.kills < kills and campaign.runs < 10 * kills:
            harness.run_one(campaign, campaign.runs)
        # The next complete run removes whatever the last kill left.
        area = workdir / "run"
        pid = harness.server.start(["flatten", str(harness.checkpoint), "-o", str(area / "out.pt"), "--device", "cpu"])
        if harness.server.wait(pid) != 0:
            campaign.failures.append("the final complete run failed")
        if [name for name in os.listdir(area) if name.startswith(".memlayout-")]:
            campaign.leftovers_after_next_run += 1
            campaign.failures.append("temporaries left after the final complete run")
    finally:
        harness.close()
        shutil.rmtree(workdir, ignore_errors=True)
    campaign.seconds = time.perf_counter() - started
    return campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".bench-data" / "sigkill")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    campaign = run_campaign(args.workdir, args.kills, args.mib, args.seed)
    figures = campaign.as_dict() | {"mib": args.mib, "seed": args.seed}
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if campaign.ok() and campaign.kills >= args.kills else 1


if __name__ == "__main__":
    raise SystemExit(main())
