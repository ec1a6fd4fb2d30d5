"""`memlayout.inspect` from a thread pool: results equal to serial runs, process state untouched.

Audit services call the library from thread pools, so one inspection must never
see another's state: not the unpickler's hook on `sys.excepthook`, not a reader,
not a cache.
"""

from __future__ import annotations

import io
import pickle
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import memlayout
from memlayout.errors import CorruptCheckpointError
from memlayout.load.restricted_pickle import run_unpickler
from memlayout.report.json_report import render_json
from memlayout.rules import RuleConfig
from tests.corpus.make_seeds import seed_paths

THREADS = 8


def report_of(path: Path, deep: bool) -> str:
    return render_json(memlayout.inspect(str(path), config=RuleConfig(deep=deep)))


@pytest.mark.parametrize("deep", [False, True], ids=["metadata", "deep"])
def test_eight_threads_on_different_files_equal_serial_runs(deep: bool) -> None:
    paths = list(seed_paths().values())
    serial = {path: report_of(path, deep) for path in paths}
    # Every file several times, all threads released at once, so loads overlap.
    work = paths * 3
    start = threading.Barrier(THREADS)

    def inspect_after_barrier(path: Path) -> tuple[Path, str]:
        if threading.current_thread().name not in started:
            started.add(threading.current_thread().name)
            start.wait(timeout=60)
        return path, report_of(path, deep)

    started: set[str] = set()
    hook = sys.excepthook
    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(inspect_after_barrier, work))
    assert len(results) == len(work)
    for path, report in results:
        assert report == serial[path], f"{path.name}: a threaded inspection differs from the serial one"
    assert sys.excepthook is hook


def test_overlapping_unpicklers_restore_the_hook_and_filter_only_their_own_thread() -> None:
    # Two loads overlap in time: A starts, B starts, A ends, B ends. With a hook
    # swapped per call, A would restore the original while B still relies on its
    # filter, and B would then reinstall A's filter for good.
    forwarded: list[str] = []

    def original(kind: type[BaseException], value: BaseException, trace: object) -> None:
        forwarded.append(f"{threading.current_thread().name}: {value}")

    report = "deallocated bytearray object has exported buffers"
    a_started, b_started, a_done = threading.Event(), threading.Event(), threading.Event()

    class Reporting(pickle.Unpickler):
        def __init__(self, first: bool) -> None:
            super().__init__(io.BytesIO(b""))
            self.first = first

        def load(self) -> object:
            if self.first:
                a_started.set()
                assert b_started.wait(10)
            else:
                b_started.set()
                assert a_done.wait(10)
            sys.excepthook(SystemError, SystemError(report), None)  # CPython's report: dropped
            return "loaded"

    def first() -> None:
        run_unpickler(Reporting(True), "a")
        a_done.set()

    def second() -> None:
        assert a_started.wait(10)
        run_unpickler(Reporting(False), "b")

    saved = sys.excepthook
    sys.excepthook = original
    try:
        threads = [threading.Thread(target=first, name="A"), threading.Thread(target=second, name="B")]
        for thread in threads:
            thread.start()
        # While both load, a report from a thread that is not unpickling still gets through.
        assert b_started.wait(10)
        sys.excepthook(SystemError, SystemError(report), None)
        for thread in threads:
            thread.join(10)
        assert sys.excepthook is original, "the hook in place before loading must be back"
        assert forwarded == [f"MainThread: {report}"]
    finally:
        sys.excepthook = saved


def test_a_damaged_pickle_in_one_thread_does_not_disturb_another() -> None:
    good = seed_paths()["module.pt"]
    expected = report_of(good, False)

    def damaged() -> None:
        with pytest.raises(CorruptCheckpointError):
            run_unpickler(pickle.Unpickler(io.BytesIO(b"\x80\x05\x96" + (1 << 52).to_bytes(8, "little"))), "x")

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(damaged if i % 2 else report_of, *(() if i % 2 else (good, False)))
                   for i in range(4 * THREADS)]
        results = [f.result() for f in futures]
    assert all(r == expected for r in results if r is not None)
