"""Replay every input of `tests/corpus/regressions/` and say what each does now.

Each input once broke a figure (a traceback, a hang, an execution, memory without
bound); `manifest.json` records what it broke and what memlayout does with it
since the fix. This runs in a child process with its address space capped, so a
regression shows as a failed test instead of an exhausted machine:

    python -m tests.corpus.replay     # prints one JSON object per input
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REGRESSIONS = Path(__file__).resolve().parent / "regressions"
ADDRESS_SPACE_LIMIT = 3 << 30


def manifest() -> dict[str, dict[str, str]]:
    """file name -> {target, broke, expect, contains}."""
    loaded: dict[str, dict[str, str]] = json.loads((REGRESSIONS / "manifest.json").read_text())
    return loaded


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def replay_one(name: str, entry: dict[str, str], scratch: Path) -> dict[str, Any]:
    import memlayout
    from memlayout.errors import MemlayoutError
    from memlayout.rules import RuleConfig
    from tests.fuzz.harness import Canary, peak_rss_mib, read_rss_mib
    from tests.fuzz.targets import TARGETS

    canary = _CANARY or Canary(str(scratch / "memlayout-canary"))
    globals()["_CANARY"] = canary
    path = TARGETS[entry["target"]].materialize((REGRESSIONS / name).read_bytes(), scratch)
    outcomes, seconds = [], 0.0
    for deep in (False, True):
        started = time.perf_counter()
        try:
            memlayout.inspect(str(path), config=RuleConfig(deep=deep))
            outcomes.append({"outcome": "ok", "message": "", "memory_error": False})
        except MemlayoutError as exc:
            outcomes.append({"outcome": type(exc).__name__, "message": exc.one_line(),
                             "memory_error": any(isinstance(e, MemoryError) for e in _chain(exc))})
        except Exception as exc:
            outcomes.append({"outcome": f"traceback: {type(exc).__name__}", "message": str(exc)[:300],
                             "memory_error": isinstance(exc, MemoryError)})
        seconds = max(seconds, time.perf_counter() - started)
    from tests.invariants import violations

    read = any(outcome["outcome"] == "ok" for outcome in outcomes)
    return {"name": name, "outcomes": outcomes, "seconds": round(seconds, 3), "executions": canary.check(),
            "peak_rss_mib": round(peak_rss_mib(), 1), "read_rss_mib": round(read_rss_mib(), 1),
            "violations": violations(str(path)) if read else []}


_CANARY: Any = None


def main() -> int:
    from tests.fuzz.harness import limit_address_space

    limit_address_space(ADDRESS_SPACE_LIMIT)
    with tempfile.TemporaryDirectory(prefix="memlayout-replay-") as folder:
        for name, entry in sorted(manifest().items()):
            print(json.dumps(replay_one(name, entry, Path(folder))), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
