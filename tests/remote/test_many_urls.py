"""Many URLs in one command against a real nginx: bounded descriptors, the disk's reports, few ranges per zip."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.remote.hub_repos import comparable, watched
from tests.remote.nginx import Server
from tests.remote.reports import json_report, same_report_remotely

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def served_folders(nginx: Server, model_folders: dict[str, Path]) -> dict[str, str]:
    """The three model folders under nginx's files/, by kind: their folder names."""
    names = {}
    for kind, folder in model_folders.items():
        names[kind] = f"audit-{kind}"
        target = nginx.root / "files" / names[kind]
        if not target.exists():
            shutil.copytree(folder, target)
    return names


def folder_urls(server: Server, names: dict[str, str]) -> dict[str, list[str]]:
    """Each kind's folder by every URL that names a folder: ending in /, its config.json, and its index."""
    urls = {}
    for kind, name in names.items():
        base = f"{server.url}/files/{name}/"
        urls[kind] = [base, base + "config.json"]
        if kind == "sharded":
            urls[kind].append(base + "model.safetensors.index.json")
    return urls


def test_many_urls_with_few_descriptors_each_as_from_disk(
    nginx: Server, served_folders: dict[str, str], local_model_reports: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    by_kind = folder_urls(nginx, served_folders)
    paths = [(kind, url) for _ in range(25) for kind, urls in by_kind.items() for url in urls]
    assert len(paths) == 175
    run = watched(["inspect", "--format", "jsonl", "--fail-on", "never", "--jobs", "8", "--paths-from", "-"], {},
                  fd_limit=64, stdin="".join(f"{url}\n" for _, url in paths))
    assert run.code == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert sorted(line["path"] for line in lines) == sorted(url for _, url in paths)
    kind_of = {url: kind for kind, url in paths}
    for line in lines:
        assert comparable(line["report"]) == local_model_reports[kind_of[line["path"]]], line["path"]
    assert run.peak_fds < 48


def test_a_zips_local_headers_and_pickle_take_one_request(nginx: Server, model_folders: dict[str, Path]) -> None:
    path = model_folders["bin"] / "pytorch_model.bin"
    served = nginx.root / "files" / "audit-one.bin"
    shutil.copy(path, served)
    with zipfile.ZipFile(path) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename]
    assert len(records) > 20
    mark = nginx.log_mark()
    same_report_remotely(str(path), f"{nginx.url}/files/audit-one.bin")
    logged = nginx.requests_since(mark)
    # Per read (two: the first says which rules a remote read skips, the second is compared):
    # the head and the end records in one request, the directory, then every record's local
    # header and data.pkl in one multipart request: not a request per storage record.
    assert len(logged) == 2 * 3, logged
    several = [r for r in logged if r.range.count(",") >= len(records)]
    assert len(several) == 2 and all(r.status == 206 for r in several)


def test_a_server_that_takes_one_range_a_request_is_asked_one_at_a_time(
    nginx: Server, model_folders: dict[str, Path]
) -> None:
    path = model_folders["bin"] / "pytorch_model.bin"
    shutil.copy(path, nginx.root / "files" / "audit-onerange.bin")
    url = f"{nginx.url}/onerange/audit-onerange.bin"
    mark = nginx.log_mark()
    report = json_report(url)
    logged = nginx.requests_since(mark)
    # The first request, with two ranges, was answered 200 and the whole file (nginx's max_ranges 1),
    # which is dropped unread; from then on one range a request, and the report is the disk's.
    assert logged[0].status == 200 and "," in logged[0].range
    assert len(logged) > 2 and all(r.status == 206 and "," not in r.range for r in logged[1:])
    assert [f["code"] for f in report["findings"]] == [
        f["code"] for f in json_report(str(path), "--ignore", "ML102")["findings"]
    ]
