"""Many paths: the list a file gives, the shard a machine takes, several in flight, one exit code."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest

from memlayout.errors import UsageError
from memlayout.pipeline.batch import EXIT_CLEAN, EXIT_FAILED, EXIT_USAGE_OR_LOAD_ERROR, exit_status
from memlayout.pipeline.many_paths import in_flight, parse_shard, read_path_list, take_shard


def test_a_path_list_skips_blank_lines_and_comments_and_strips_spaces(tmp_path: Path) -> None:
    listing = tmp_path / "paths.txt"
    listing.write_text("# registry export\nhf://a/b\n\n  models/x.pt  \n\t# indented comment\nhttps://h/y/\r\n")
    assert read_path_list(str(listing)) == ["hf://a/b", "models/x.pt", "https://h/y/"]


def test_a_dash_reads_the_list_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("a.pt\nb.pt\n"))
    assert read_path_list("-") == ["a.pt", "b.pt"]


def test_a_missing_or_binary_list_is_one_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--paths-from nope\.txt: no such file"):
        read_path_list("nope.txt")
    binary = tmp_path / "list.bin"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(UsageError, match="cannot be read"):
        read_path_list(str(binary))


@pytest.mark.parametrize("value", ["0/3", "4/3", "1/0", "a/b", "1-3", "2"])
def test_a_shard_is_k_of_n_from_1(value: str) -> None:
    with pytest.raises(UsageError, match="--shard"):
        parse_shard(value)


def test_the_shards_of_a_list_are_disjoint_and_cover_it() -> None:
    paths = [f"p{i}" for i in range(11)]
    shards = [take_shard(paths, parse_shard(f"{k}/4")) for k in range(1, 5)]
    assert shards[0] == ["p0", "p4", "p8"] and shards[3] == ["p3", "p7"]
    assert sorted(p for shard in shards for p in shard) == sorted(paths)
    assert sum(len(shard) for shard in shards) == len(paths)
    assert take_shard(paths, None) == paths


def test_in_flight_keeps_at_most_jobs_at_work_and_returns_every_index() -> None:
    at_work = 0
    most = 0
    lock = threading.Lock()

    def work(item: int) -> int:
        nonlocal at_work, most
        with lock:
            at_work += 1
            most = max(most, at_work)
        time.sleep(0.01 * (item % 3))
        with lock:
            at_work -= 1
        return item * 2

    results = dict(in_flight(iter(range(40)), work, jobs=5))
    assert results == {i: i * 2 for i in range(40)}
    assert 1 < most <= 5


def test_in_flight_with_one_job_works_in_order_here() -> None:
    seen = []
    assert list(in_flight(["a", "b"], lambda item: seen.append(threading.current_thread().name) or item, 1)) == [
        (0, "a"), (1, "b"),
    ]
    assert seen == [threading.current_thread().name] * 2


def test_an_error_in_a_work_ends_the_iteration() -> None:
    started = []

    def work(item: int) -> int:
        started.append(item)
        if item == 3:
            raise ValueError("boom")
        time.sleep(0.01)
        return item

    with pytest.raises(ValueError, match="boom"):
        list(in_flight(range(1000), work, jobs=4))
    assert len(started) < 100


@pytest.mark.parametrize(
    ("paths", "failed", "failing", "expected"),
    [
        (3, 0, 0, EXIT_CLEAN),
        (3, 0, 2, EXIT_FAILED),
        (3, 1, 0, EXIT_USAGE_OR_LOAD_ERROR),  # a path not read fails the audit, whatever the findings
        (3, 1, 2, EXIT_USAGE_OR_LOAD_ERROR),
        (0, 0, 0, EXIT_USAGE_OR_LOAD_ERROR),
    ],
)
def test_the_exit_status_of_many_paths(paths: int, failed: int, failing: int, expected: int) -> None:
    assert exit_status(paths, failed, failing) == expected
