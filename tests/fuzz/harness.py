"""Fuzz one target: atheris (coverage-guided libFuzzer) or, without it, hypothesis byte mutation.

Every input is written where the target says and inspected twice through the
library, metadata only and `--deep`, and four figures are kept:

- tracebacks: any exception that is not a `MemlayoutError` (the CLI would print
  "unexpected ..."), or a native crash (the driver sees the process die);
- slow inputs: one inspection taking over 5 s;
- executions: the canary. Payload seeds aim at a canary path; an audit hook
  watches every event (open, exec, compile, os.system, subprocess.Popen, ...) for
  that path, and the path itself and an environment variable are checked after
  each input;
- peak RSS: the process's high-water mark (VmHWM) after each input; inputs are at most 1 MiB.

And one check of what is returned: an input memlayout reads must give a possible
report (`tests.invariants`: unique names, every tensor inside its storage and every
storage inside the file, sizes that add up); each one that does not is a
property violation.

Each input that breaks one is saved under the failures folder with what it broke,
for `tests/corpus/` (see `tests/corpus/README.md`). The summary JSON is rewritten
every 200 inputs and at the end. Usage (the driver, `tests/fuzz/run.py`, runs this):

    python -m tests.fuzz.harness TARGET --runs N --out DIR [--engine atheris|hypothesis] [--seed N]

With the hypothesis engine TARGET may be `all`: every target in turn, one process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

SLOW_SECONDS = 5.0
WORK = ".work"
"""The folder under OUT that holds a run's scratch files and libFuzzer corpus."""
RSS_LIMIT_MIB = 512
MAX_INPUT = 1 << 20
PWNED_ENV = "MEMLAYOUT_PWNED"


CANARY_MARK = "memlayout-canary"
"""Every canary path holds this, so inputs saved by an earlier run still trip it."""


class Canary:
    """Did anything touch a canary path? An audit hook sees it before any effect."""

    # Events that carry names read from the input, not actions taken on it.
    _QUIET = frozenset({"pickle.find_class", "object.__getattr__", "object.__setattr__"})

    def __init__(self, path: str) -> None:
        self.path = path
        self.fired: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event in self._QUIET:
            return
        for arg in args:
            if _mentions_canary(arg) or (
                isinstance(arg, (list, tuple)) and any(_mentions_canary(item) for item in arg)
            ):
                self.fired.append(event)
                return

    def check(self) -> list[str]:
        fired = list(self.fired)
        if os.path.lexists(self.path):
            fired.append("the canary file exists")
            os.unlink(self.path)
        if os.environ.pop(PWNED_ENV, None) is not None:
            fired.append("the canary environment variable is set")
        self.fired.clear()
        return fired


def _mentions_canary(value: Any) -> bool:
    if isinstance(value, str):
        return CANARY_MARK in value
    if isinstance(value, (bytes, bytearray)):
        return CANARY_MARK.encode() in value
    return isinstance(value, os.PathLike) and CANARY_MARK in os.fspath(value)


_LIBRARIES_RSS_MIB = 0.0
"""Resident MiB once the libraries a read may load are loaded (`load_read_libraries`)."""


def load_read_libraries() -> float:
    """Import what a read may load, and return the resident MiB after.

    numpy (OpenBLAS reserves its buffers when imported) and, where installed, torch,
    which ML601 asks for its weights-only allow-list. The memory goals are of what a
    read allocates, not of these libraries: a CUDA build of torch maps several GiB and
    keeps about 560 MiB resident, so under fixed caps every read on torch
    2.14.1+cu130 stopped with a MemoryError or read as over 512 MiB.
    """
    global _LIBRARIES_RSS_MIB
    import importlib.util

    import numpy  # noqa: F401

    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401
    _LIBRARIES_RSS_MIB = _status_mib("VmRSS:")
    return _LIBRARIES_RSS_MIB


def read_rss_mib() -> float:
    """The peak resident MiB above what `load_read_libraries` left resident: what reads took."""
    return max(0.0, peak_rss_mib() - _LIBRARIES_RSS_MIB)


def _status_mib(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def limit_address_space(extra: int) -> int:
    """Cap this process's address space at what it maps once the read libraries are loaded, plus `extra` bytes.

    Returns the cap. The libraries come first (`load_read_libraries`), so that the cap
    bounds what the reads allocate, not what the libraries map.
    """
    load_read_libraries()
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    cap = mapped + extra
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return cap


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB.

    VmHWM, not `ru_maxrss`: Linux carries `ru_maxrss` over `execve`, so a child of
    a pytest worker that imported torch would start at the worker's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Run:
    """The figures of one target's run, and the inputs that broke them."""

    def __init__(self, target_name: str, engine: str, out: Path, canary: Canary) -> None:
        from tests.fuzz.targets import TARGETS

        self.target = TARGETS[target_name]
        self.engine = engine
        self.out = out
        self.canary = canary
        # Under OUT, not /tmp: a run that libFuzzer ends (a crash, its own timeout)
        # cleans up nothing, and the driver removes OUT's work folder afterwards.
        (out / WORK).mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{target_name}.", dir=out / WORK))
        self.inputs = 0
        self.errors: Counter[str] = Counter()
        self.tracebacks = 0
        self.slow = 0
        self.executions = 0
        self.over_rss = 0
        self.violations = 0
        self.max_seconds = 0.0
        self.largest_input = 0
        self.baseline_rss = load_read_libraries()
        self.failures: list[str] = []
        self.started = time.perf_counter()

    def _save(self, data: bytes, kind: str, detail: str) -> None:
        name = f"{self.target.name}-{kind}-{hashlib.sha1(data).hexdigest()[:16]}"
        (self.out / f"{name}.bin").write_bytes(data)
        (self.out / f"{name}.txt").write_text(f"{self.target.name}: {kind}: {detail}\n")
        if len(self.failures) < 50:
            self.failures.append(f"{name}: {detail}")

    def check(self, data: bytes) -> None:
        import memlayout
        from memlayout.errors import MemlayoutError
        from memlayout.rules import RuleConfig

        if len(data) > MAX_INPUT:
            return
        self.inputs += 1
        self.largest_input = max(self.largest_input, len(data))
        path = self.target.materialize(data, self.scratch)
        read = False
        for deep in (False, True):
            started = time.perf_counter()
            try:
                memlayout.inspect(str(path), config=RuleConfig(deep=deep))
                self.errors["ok"] += 1
                read = True
            except MemlayoutError as exc:
                self.errors[type(exc).__name__] += 1
            except Exception as exc:  # every other exception is a traceback the CLI would hide
                self.tracebacks += 1
                self._save(data, "traceback", f"deep={deep}: {type(exc).__name__}: {exc}"[:500])
            seconds = time.perf_counter() - started
            self.max_seconds = max(self.max_seconds, seconds)
            if seconds > SLOW_SECONDS:
                self.slow += 1
                self._save(data, "slow", f"deep={deep}: {seconds:.1f} s")
        if read:
            self._check_properties(data, path)
        fired = self.canary.check()
        if fired:
            self.executions += 1
            self._save(data, "execution", ", ".join(sorted(set(fired))))
        if read_rss_mib() > RSS_LIMIT_MIB:
            self.over_rss += 1
            self._save(data, "rss", f"reads' peak RSS {read_rss_mib():.0f} MiB after this input")
        if self.inputs % 200 == 0:
            self.write_summary()

    def _check_properties(self, data: bytes, path: Path) -> None:
        from tests.invariants import violations

        try:
            broken = violations(str(path))
        except Exception as exc:  # the checker's own read: a traceback like any other
            self.tracebacks += 1
            self._save(data, "traceback", f"properties: {type(exc).__name__}: {exc}"[:500])
            return
        if broken:
            self.violations += 1
            self._save(data, "property", "; ".join(broken)[:500])

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.target.name, "engine": self.engine, "inputs": self.inputs,
            "tracebacks": self.tracebacks, "slow_inputs": self.slow, "executions": self.executions,
            "over_rss_inputs": self.over_rss, "property_violations": self.violations,
            "max_seconds": round(self.max_seconds, 3),
            "peak_rss_mib": round(peak_rss_mib(), 1), "baseline_rss_mib": round(self.baseline_rss, 1),
            "read_rss_mib": round(read_rss_mib(), 1),
            "largest_input": self.largest_input, "outcomes": dict(sorted(self.errors.items())),
            "failures": self.failures, "seconds": round(time.perf_counter() - self.started, 1),
        }

    def write_summary(self) -> None:
        temporary = self.out / f"{self.target.name}.summary.json.part"
        temporary.write_text(json.dumps(self.summary(), indent=1))
        os.replace(temporary, self.out / f"{self.target.name}.summary.json")

    def close(self) -> None:
        self.write_summary()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _run_atheris(run: Run, seeds: list[bytes], runs: int, seed: int) -> None:
    import atheris

    with atheris.instrument_imports(include=["memlayout", "zipfile", "tarfile"]):
        import memlayout
        import memlayout.load
        import memlayout.pipeline.inspection  # noqa: F401
    corpus = Path(tempfile.mkdtemp(prefix=f"corpus-{run.target.name}.", dir=run.out / WORK))
    for data in seeds:
        (corpus / hashlib.sha1(data).hexdigest()).write_bytes(data)

    def one_input(data: bytes) -> None:
        run.check(data)
        if run.inputs >= runs:
            run.close()
            shutil.rmtree(corpus, ignore_errors=True)
            os._exit(0)

    atheris.Setup(
        [sys.argv[0], f"-runs={runs * 4}", f"-max_len={MAX_INPUT}", f"-seed={seed}", "-timeout=60",
         "-rss_limit_mb=2048", f"-artifact_prefix={run.out}/{run.target.name}-crash-", "-print_final_stats=0",
         str(corpus)],
        one_input,
    )
    try:
        atheris.Fuzz()
    finally:
        run.close()
        shutil.rmtree(corpus, ignore_errors=True)


def mutate(data: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    """One to four edits: bit flips, interesting integers, inserts, deletions, cuts, splices."""
    edited = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(edited) + 1)
        kind = rng.choice(["flip", "byte", "int", "insert", "delete", "cut", "splice", "repeat"])
        if kind == "flip" and edited:
            edited[min(at, len(edited) - 1)] ^= 1 << rng.randrange(8)
        elif kind == "byte" and edited:
            edited[min(at, len(edited) - 1)] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif kind == "int":
            value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1, 2**40, rng.getrandbits(64)])
            edited[at : at + 8] = value.to_bytes(8, "little")
        elif kind == "insert":
            edited[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 16)))
        elif kind == "delete":
            del edited[at : at + rng.randint(1, 32)]
        elif kind == "cut":
            del edited[at:]
        elif kind == "splice" and others:
            other = rng.choice(others)
            start = rng.randrange(len(other) + 1)
            edited[at:at] = other[start : start + rng.randint(1, 64)]
        elif kind == "repeat" and edited:
            chunk = edited[at : at + rng.randint(1, 16)]
            edited[at:at] = chunk * rng.randint(2, 64)
    return bytes(edited[:MAX_INPUT])


def _run_hypothesis(run: Run, seeds: list[bytes], runs: int, seed: int) -> None:
    # Without atheris: hypothesis draws which seed and how many mutation rounds,
    # and a seeded Random mutates, so a run is reproducible from --seed.
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=runs, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.sampled_from(range(len(seeds))), st.integers(0, 2**32 - 1), st.integers(1, 3))
    def one_input(index: int, salt: int, rounds: int) -> None:
        rng = random.Random(seed ^ salt)
        data = seeds[index]
        for _ in range(rounds):
            data = mutate(data, rng, seeds)
        run.check(data)

    for data in seeds:
        run.check(data)
    one_input()
    run.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engine", choices=["atheris", "hypothesis"], default=None)
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args()
    engine = args.engine
    if engine is None:
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "hypothesis"
    canary = Canary(os.path.join(tempfile.gettempdir(), f"{CANARY_MARK}-{os.getpid()}"))
    if engine == "atheris":
        # libFuzzer runs once per process: one target.
        run = Run(args.target, engine, args.out, canary)
        _run_atheris(run, run.target.seeds(canary.path), args.runs, args.seed)
        return 0
    from tests.fuzz.targets import TARGETS

    for name in TARGETS if args.target == "all" else [args.target]:
        run = Run(name, engine, args.out, canary)
        _run_hypothesis(run, run.target.seeds(canary.path), args.runs, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
