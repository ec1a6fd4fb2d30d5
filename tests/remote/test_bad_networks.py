"""Every way a remote read goes wrong ends in one line on stderr and exit 2, against a real nginx."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.remote.nginx import Server, free_port
from tests.remote.reports import Run, memlayout, same_report_remotely

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def served_file(nginx: Server) -> Path:
    path = nginx.root / "files" / "errors.safetensors"
    safetensors_torch.save_file({"w": torch.randn(64, 64), "b": torch.zeros(64)}, str(path))
    return path


def one_line_failure(run: Run) -> str:
    """The run's one stderr line, after checking it failed as a load error does."""
    assert run.code == 2, (run.code, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_not_found_says_404_and_mentions_the_token(nginx: Server, served_file: Path) -> None:
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/files/missing.safetensors"))
    assert "HTTP 404" in line and "HF_TOKEN" in line


@pytest.mark.parametrize(("location", "status"), [("forbidden", 403), ("unauthorized", 401)])
def test_refused_access_says_the_status_and_mentions_the_token(
    nginx: Server, served_file: Path, location: str, status: int
) -> None:
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/{location}/errors.safetensors"))
    assert f"HTTP {status}" in line and "HF_TOKEN" in line


def test_a_server_without_range_is_refused_with_the_size_it_would_download(nginx: Server) -> None:
    # 64 MiB, more than loopback's socket buffers hold, so nginx's log shows where the reply stopped.
    big = nginx.root / "files" / "big.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(16 << 20)}, str(big))
    mark = nginx.log_mark()
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/norange/big.safetensors"))
    assert f"downloading all {big.stat().st_size:,} bytes" in line and "--download" in line
    # The refusal stops the reply before its body is read: nginx could send only part of the file.
    logged = nginx.requests_since(mark)
    assert [r.status for r in logged] == [200]
    assert logged[0].body_bytes < big.stat().st_size // 2
    big.unlink()


def test_download_reads_a_file_whole_from_a_server_without_range(nginx: Server, served_file: Path) -> None:
    same_report_remotely(str(served_file), f"{nginx.url}/norange/errors.safetensors", "--download")


def test_a_redirect_loop_is_one_line(nginx: Server) -> None:
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/loop/errors.safetensors"))
    assert "redirect loop" in line


def test_a_redirect_to_another_scheme_is_refused(nginx: Server, served_file: Path) -> None:
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/to-https/errors.safetensors"))
    assert "redirects to https://" in line and "another scheme" in line


def test_a_file_that_changes_between_requests_is_refused(nginx: Server, served_file: Path) -> None:
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/etag-changes/errors.safetensors"))
    assert "changed while it was being read" in line


def test_a_truncated_body_is_one_line(nginx: Server) -> None:
    line = one_line_failure(memlayout("inspect", f"{nginx.url}/truncated/errors.safetensors"))
    assert "truncated" in line


def test_a_slow_server_times_out_within_the_bound(nginx: Server, served_file: Path) -> None:
    started = time.monotonic()
    line = one_line_failure(memlayout("inspect", "--timeout", "1", f"{nginx.url}/slow/errors.safetensors"))
    assert "timeout" in line and "--timeout" in line
    assert time.monotonic() - started < 30


def test_nothing_listening_is_one_line() -> None:
    line = one_line_failure(memlayout("inspect", f"http://127.0.0.1:{free_port()}/model.safetensors"))
    assert "cannot connect" in line


def test_diff_follows_the_download_hint_as_inspect_does(nginx: Server, served_file: Path) -> None:
    # The refusal's hint names --download; diff reads URLs too, so the hint must work there.
    url = f"{nginx.url}/norange/errors.safetensors"
    line = one_line_failure(memlayout("diff", url, str(served_file)))
    assert "--download" in line
    run = memlayout("diff", "--download", "--format", "json", url, str(served_file))
    assert run.code == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["a"]["summary"]["tensors"] == 2 and report["changes"] == []


def test_diff_times_out_within_the_bound(nginx: Server, served_file: Path) -> None:
    started = time.monotonic()
    line = one_line_failure(memlayout("diff", "--timeout", "1", str(served_file),
                                      f"{nginx.url}/slow/errors.safetensors"))
    assert "no complete reply within 1 s" in line and "--timeout SECONDS" in line
    assert time.monotonic() - started < 30
