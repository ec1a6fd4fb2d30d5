"""A hub's worth of audits, against the fake Hub (benchmarks/harness/fake_hub.py): many repositories in one command.

The benchmark (benchmarks/speed/bench_hub_audit.py) runs 1,000 repositories at 0 and 50
ms against huggingface_hub; these tests run a slice of it, each on what could go
wrong: a repository misread, descriptors or memory growing with the paths, a report
lost when the run stops, a silent Hub holding the command, a request too many.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.fake_hub import running_fake_hub
from tests.remote.hub_repos import comparable, repositories, watched
from tests.remote.reports import REPO

pytest.importorskip("aiohttp")
pytest.importorskip("huggingface_hub")


def jsonl(path: Path | str) -> list[dict[str, Any]]:
    text = Path(path).read_text() if isinstance(path, Path) else path
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def assert_each_is_its_local_copy(lines: list[dict[str, Any]], repos: dict[str, Path], folders: dict[str, Path],
                                  local: dict[str, dict[str, Any]]) -> None:
    kind_of = {folder: kind for kind, folder in folders.items()}
    for line in lines:
        assert line["error"] is None, line["error"]
        kind = kind_of[repos[line["path"].removeprefix("hf://")]]
        assert comparable(line["report"]) == local[kind], line["path"]


def test_many_repositories_in_one_command_each_read_as_from_disk(
    model_folders: dict[str, Path], local_model_reports: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    repos = repositories(model_folders, 30)
    listing = tmp_path / "repos.txt"
    listing.write_text("# the audit's repositories\n\n" + "".join(f"hf://{repo}\n" for repo in repos))
    with running_fake_hub(repos, latency_s=0.02, page_size=2) as hub:  # listings paged two files a page
        run = watched(["inspect", "--format", "jsonl", "--fail-on", "never", "--paths-from", str(listing),
                       "-o", str(tmp_path / "out.jsonl")], hub.environment())
    assert run.code == 0, run.stderr
    assert run.stderr == ""  # no progress bar off a terminal
    lines = jsonl(tmp_path / "out.jsonl")
    assert sorted(line["path"] for line in lines) == sorted(f"hf://{repo}" for repo in repos)
    assert_each_is_its_local_copy(lines, repos, model_folders, local_model_reports)


def test_descriptors_and_memory_stay_flat_in_the_number_of_repositories(
    model_folders: dict[str, Path], tmp_path: Path
) -> None:
    # Each repository used to leave ten descriptors open (an fsspec filesystem and an aiohttp
    # session per source, neither ever closed): under `ulimit -n 96`, 300 repositories failed
    # from the tenth on with "Too many open files", and memory grew 0.3 MB a repository.
    runs = {}
    for count in (40, 300):
        repos = repositories(model_folders, count, prefix=f"flat{count}/model")
        with running_fake_hub(repos) as hub:
            runs[count] = watched(["inspect", "--format", "jsonl", "--fail-on", "never", "--paths-from", "-"],
                                  hub.environment(), fd_limit=96, stdin="".join(f"hf://{r}\n" for r in repos))
        assert runs[count].code == 0, runs[count].stderr[-2000:]
        assert len(jsonl(runs[count].stdout)) == count
    assert runs[300].peak_fds < 80
    assert runs[300].peak_fds <= runs[40].peak_fds + 8
    assert runs[300].peak_rss_mib < runs[40].peak_rss_mib + 25, (runs[40].peak_rss_mib, runs[300].peak_rss_mib)


def test_a_run_killed_halfway_leaves_json_lines_that_each_parse(model_folders: dict[str, Path], tmp_path: Path) -> None:
    repos = repositories(model_folders, 200)
    out = tmp_path / "audit.jsonl"
    with running_fake_hub(repos, latency_s=0.05) as hub:
        process = subprocess.Popen(
            [sys.executable, "-m", "memlayout", "inspect", "--format", "jsonl", "--fail-on", "never", "-o", str(out),
             *(f"hf://{repo}" for repo in repos)],
            env={**os.environ, "PYTHONPATH": str(REPO), **hub.environment()}, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while (not out.exists() or out.read_bytes().count(b"\n") < 30) and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
    text = out.read_text()
    lines = jsonl(text)  # every line whole: the file ends with a newline, each line parses
    assert 30 <= len(lines) < len(repos)
    assert all(line["report"] is not None for line in lines)


def test_an_interrupted_run_stops_at_once_and_keeps_the_lines_written(
    model_folders: dict[str, Path], tmp_path: Path
) -> None:
    # Paths in flight wait on the run's HTTP loop: an interrupt cancels their reads, and no
    # thread is left waiting on a loop that stopped (the process would never exit).
    repos = repositories(model_folders, 200)
    out = tmp_path / "audit.jsonl"
    with running_fake_hub(repos, latency_s=0.05) as hub:
        process = subprocess.Popen(
            [sys.executable, "-m", "memlayout", "inspect", "--format", "jsonl", "-o", str(out),
             *(f"hf://{repo}" for repo in repos)],
            env={**os.environ, "PYTHONPATH": str(REPO), **hub.environment()}, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C
        )
        deadline = time.monotonic() + 120
        while (not out.exists() or out.read_bytes().count(b"\n") < 20) and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - interrupted < 10
    assert process.returncode == 130 and stderr.strip().splitlines()[-1] == "memlayout: interrupted", stderr[-3000:]
    assert "Traceback" not in stderr
    assert 20 <= len(jsonl(out)) < len(repos)


def test_missing_and_silent_repositories_among_200_end_within_the_timeout(
    model_folders: dict[str, Path], tmp_path: Path
) -> None:
    repos = repositories(model_folders, 190)
    missing = [f"audit/missing-{i}" for i in range(5)]
    silent = frozenset(f"audit/silent-{i}" for i in range(5))
    paths = [f"hf://{repo}" for repo in [*repos, *missing, *sorted(silent)]]
    with running_fake_hub(repos, latency_s=0.02, silent=silent) as hub:
        run = watched(["inspect", "--format", "jsonl", "--timeout", "2", "--fail-on", "never", "--paths-from", "-"],
                      hub.environment(), stdin="\n".join(paths))
    assert run.seconds < 30
    assert run.code == 2
    assert "Traceback" not in run.stderr
    lines = jsonl(run.stdout)
    assert len(lines) == 200
    errors = {line["path"]: line["error"] for line in lines if line["report"] is None}
    assert sorted(errors) == sorted(f"hf://{repo}" for repo in [*missing, *silent])
    for repo in missing:
        assert "has no model repository" in errors[f"hf://{repo}"] and "HTTP 404" in errors[f"hf://{repo}"]
    for repo in silent:
        assert "no complete reply within 2 s" in errors[f"hf://{repo}"]
    # Each failure is also one line on stderr, and nothing else is.
    assert sorted(run.stderr.splitlines()) == sorted(f"memlayout: error: {error}" for error in errors.values())


def test_a_silent_hub_listing_is_bounded_by_timeout(tmp_path: Path) -> None:
    # huggingface_hub's own client listed the files with no timeout and five retries:
    # `--timeout 2` did not reach it, and a Hub that never answered held the command.
    with running_fake_hub({}, silent=frozenset({"org/silent"})) as hub:
        run = watched(["inspect", "--timeout", "2", "hf://org/silent"], hub.environment(), timeout=60)
    assert run.seconds < 15
    assert run.code == 2 and len(run.stderr.splitlines()) == 1
    assert "no complete reply within 2 s (a timeout)" in run.stderr


@pytest.mark.parametrize(("kind", "most"), [("onefile", 5), ("sharded", 0), ("bin", 6)])
def test_each_lfs_file_is_resolved_once_and_its_ranges_go_to_the_cdn(
    model_folders: dict[str, Path], kind: str, most: int
) -> None:
    folder = model_folders[kind]
    weights = [p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin")]
    with running_fake_hub({"org/model": folder}) as hub:
        run = watched(["inspect", "--format", "json", "--fail-on", "never", "hf://org/model"], hub.environment())
        assert run.code == 0, run.stderr
        counted = dict(hub.stats.requests)
    # One 302 per weights file: later ranges of the file go to where it led, not through the Hub again.
    assert counted.get("resolve 302") == len(weights)
    # The listing, then config.json with the index or the file's first bytes, then (a sharded model) one range
    # per shard, or (a .bin) its directory, then every local header and data.pkl in one request.
    allowed = most or 3 + 2 * len(weights)
    assert sum(counted.values()) <= allowed, counted
    note = next(n for n in json.loads(run.stdout)["source"]["notes"] if n.startswith("read remotely"))
    assert f"in {sum(counted.values())} requests" in note


def test_an_interrupt_while_a_line_is_written_closes_the_http_session_before_it_leaves(
    model_folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The interrupt can land outside the reads, while the main thread writes a line. The paths'
    # generator was then left suspended, its session closed only when the interpreter collected it at
    # exit, after aiohttp had printed "Unclosed connector" below "memlayout: interrupted" (seen in CI).
    from memlayout.cli.inspect_stream import stream_json_lines
    from memlayout.io.http_transport import HttpTransport
    from memlayout.load.remote_location import RemoteOptions
    from memlayout.output.writer import LineWriter
    from memlayout.pipeline.config import Settings

    closed: list[HttpTransport] = []
    real_close, real_write = HttpTransport.close, LineWriter.write
    written: list[object] = []

    def close(transport: HttpTransport) -> None:
        closed.append(transport)
        real_close(transport)

    def write_then_interrupt(writer: LineWriter, line: Any) -> None:
        written.append(line)
        if len(written) == 3:
            raise KeyboardInterrupt
        real_write(writer, line)

    monkeypatch.setattr(HttpTransport, "close", close)
    monkeypatch.setattr(LineWriter, "write", write_then_interrupt)
    repos = repositories(model_folders, 12)
    with running_fake_hub(repos) as hub:
        for name, value in hub.environment().items():
            monkeypatch.setenv(name, value)
        with pytest.raises(KeyboardInterrupt):
            stream_json_lines([f"hf://{repo}" for repo in repos], Settings(), deep=False, remote=RemoteOptions(),
                              jobs=4, output=str(tmp_path / "out.jsonl"), debug=False)
        assert len(closed) == 1  # before the interrupt left the command, not at the interpreter's exit
    assert len(jsonl(tmp_path / "out.jsonl")) == 2


def test_a_path_that_starts_after_the_run_closed_its_transport_opens_no_session_of_its_own() -> None:
    # A path's thread still at work when the run was interrupted asked the closed transport for its
    # session, and got a new one that nothing closed: aiohttp reported it unclosed below our last line.
    from memlayout.errors import RemoteReadError
    from memlayout.io.remote import RemoteFiles, RemoteTransport

    transport = RemoteTransport(timeout_s=5)
    transport.http()
    transport.close()
    for protocol in ("https", "s3"):
        with pytest.raises(RemoteReadError, match="interrupted"):
            RemoteFiles(protocol, transport=transport)
