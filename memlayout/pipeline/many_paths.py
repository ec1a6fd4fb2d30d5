"""Many paths in one command: where they come from, which of them this machine takes, and several in flight.

- `read_path_list`: `--paths-from FILE` (`-` for stdin), one path a line; blank
  lines and lines starting with `#` are skipped, and each line is stripped of the
  spaces around it, as pip reads a requirements file.
- `take_shard`: `--shard K/N` keeps every N-th path from the K-th (K counts from
  1, as a CI matrix's index does in Jest's and Playwright's `--shard`), so N
  machines given the same list split it without overlap, and their JSON Lines
  outputs concatenate into one report.
- `in_flight`: at most `jobs` items worked on at once by a thread pool, each
  result handed back as soon as it is done. A path's work is mostly waiting on
  the network (the HTTP transport runs in a thread of its own, outside the GIL's
  way), so threads overlap what processes would only duplicate: one connection
  pool and one copy of memlayout's modules.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from memlayout.errors import UsageError

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_JOBS = 16
"""Paths in flight by default: a laptop's or a CI runner's, against a Hub 50 ms away
(benchmarks/speed/bench_hub_audit.py)."""
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def read_path_list(source: str) -> list[str]:
    """The paths a `--paths-from` file lists; `-` reads stdin.

    Raises:
        UsageError: the file cannot be read, or is not text.
    """
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
    except FileNotFoundError:
        raise UsageError(f"--paths-from {source}: no such file",
                         "name a file of paths, one a line, or - for stdin") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(f"--paths-from {source}: cannot be read ({reason})",
                         "name a text file of paths, one a line, or - for stdin") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def parse_shard(value: str) -> tuple[int, int]:
    """`--shard K/N` as (K, N), 1 <= K <= N.

    Raises:
        UsageError: not of the form K/N, or K outside 1..N.
    """
    match = _SHARD.match(value)
    if match is None:
        raise UsageError(f"--shard {value!r} is not of the form K/N", "e.g. --shard 1/4 takes paths 1, 5, 9, ...")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {value}: K must be between 1 and N",
                         f"the shards of {count} are 1/{count} to {count}/{count}"
                         if count >= 1 else "N is the number of shards, at least 1")
    return index, count


def take_shard(paths: list[str], shard: tuple[int, int] | None) -> list[str]:
    """Every N-th path from the K-th (1-based); all of them without a shard."""
    if shard is None:
        return paths
    index, count = shard
    return paths[index - 1 :: count]


def in_flight(items: Iterable[T], work: Callable[[T], R], jobs: int) -> Iterator[tuple[int, R]]:
    """(index, result) of each item as its work finishes, with at most `jobs` of them at work at once.

    With `jobs` 1 the items are worked on here, in order. An exception in a
    work (as `--debug` lets through) ends the iteration: the items not started
    are dropped.
    """
    numbered = enumerate(items)
    if jobs <= 1:
        for index, item in numbered:
            yield index, work(item)
        return
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="memlayout-path")
    pending: dict[Future[R], int] = {}

    def submit_next() -> None:
        for index, item in numbered:
            pending[pool.submit(work, item)] = index
            return

    try:
        for _ in range(jobs):
            submit_next()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=pending.__getitem__):
                index = pending.pop(future)
                yield index, future.result()
                submit_next()
    except BaseException:
        # An interrupt, an error let through, or a reader that stopped: nothing new starts, and the
        # works still at it end as the run's transport closes under them, not after their timeouts.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
