"""Checkpoints read over HTTP from a real nginx: the same report as from disk, from only the bytes needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.remote.nginx import Server
from tests.remote.reports import json_report, memlayout, same_report_remotely, served

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def checkpoints(nginx: Server) -> dict[str, Path]:
    """A safetensors file and a torch.save zip with a tie and a view, served from nginx's folder."""
    folder = nginx.root / "files"
    shared = torch.arange(64, dtype=torch.float32)
    paths = {
        "safetensors": folder / "model.safetensors",
        "zip": folder / "model.pt",
    }
    safetensors_torch.save_file(
        {"embed.weight": torch.randn(50, 16), "bias": torch.zeros(3), "copy": torch.randn(50, 16)},
        str(paths["safetensors"]), metadata={"format": "pt"},
    )
    torch.save({"a": shared, "a_view": shared[8:24], "w": torch.randn(7, 5).t(), "n": torch.ones(3)}, paths["zip"])
    return paths


def test_safetensors_over_http_gives_the_disk_report(nginx: Server, checkpoints: dict[str, Path]) -> None:
    skipped = same_report_remotely(str(checkpoints["safetensors"]), served(nginx, "model.safetensors"))
    assert skipped == ["ML102"]  # duplicate contents need tensor bytes, not fetched by default


def test_safetensors_fetches_only_its_length_and_header(nginx: Server, checkpoints: dict[str, Path]) -> None:
    path = checkpoints["safetensors"]
    header_end = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
    mark = nginx.log_mark()
    report = json_report(served(nginx, "model.safetensors"))
    logged = nginx.requests_since(mark)
    # nginx's own log, not memlayout's count: two ranges, together exactly the length and the header.
    assert [r.status for r in logged] == [206, 206]
    assert sum(r.body_bytes for r in logged) == header_end
    assert header_end < path.stat().st_size
    note = next(n for n in report["source"]["notes"] if n.startswith("read remotely"))
    assert f"{header_end} B fetched in 2 requests" in note


def test_zip_over_http_gives_the_disk_report(nginx: Server, checkpoints: dict[str, Path]) -> None:
    skipped = same_report_remotely(str(checkpoints["zip"]), served(nginx, "model.pt"))
    assert skipped == ["ML102"]


def test_zip_fetches_its_directory_and_pickle_not_its_tensors(nginx: Server, checkpoints: dict[str, Path]) -> None:
    import zipfile

    path = checkpoints["zip"]
    with zipfile.ZipFile(path) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename]
        tensor_bytes = sum(i.file_size for i in records)
    mark = nginx.log_mark()
    json_report(served(nginx, "model.pt"))
    fetched = sum(r.body_bytes for r in nginx.requests_since(mark))
    assert fetched <= path.stat().st_size - tensor_bytes


def test_deep_fetches_the_tensor_bytes_and_runs_the_content_rules(nginx: Server, checkpoints: dict[str, Path]) -> None:
    url = served(nginx, "model.safetensors")
    remote = json_report(url, "--deep")
    local = json_report(str(checkpoints["safetensors"]), "--deep")
    assert remote["skipped_rules"] == []
    assert [f["code"] for f in remote["findings"]] == [f["code"] for f in local["findings"]]


def test_a_redirect_like_the_hubs_resolve_url_is_followed(nginx: Server, checkpoints: dict[str, Path]) -> None:
    mark = nginx.log_mark()
    same_report_remotely(str(checkpoints["safetensors"]), f"{nginx.url}/redirect/model.safetensors")
    assert any(r.status == 302 for r in nginx.requests_since(mark))


def test_a_url_never_takes_trust_and_runs_nothing(nginx: Server, tmp_path: Path) -> None:
    # A pickle whose reduce would create a file when run: read remotely, it is only read.
    import pickle

    witness = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (open, (str(witness), "w"))

    folder = nginx.root / "files"
    malicious = folder / "malicious.pt"
    torch.save({"w": torch.ones(2)}, malicious)
    import zipfile

    with zipfile.ZipFile(malicious) as archive:
        members = {i.filename: archive.read(i) for i in archive.infolist()}
    pkl = next(name for name in members if name.endswith("data.pkl"))
    members[pkl] = pickle.dumps({"w": Payload()}, protocol=2)
    with zipfile.ZipFile(malicious, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    run = memlayout("inspect", f"{nginx.url}/files/malicious.pt")
    assert not witness.exists()
    assert "Traceback" not in run.stderr
    trusted = memlayout("inspect", "--trust", f"{nginx.url}/files/malicious.pt")
    assert trusted.code == 2 and not witness.exists()
    assert len(trusted.stderr.strip().splitlines()) == 1


def test_a_local_path_wins_over_a_hub_id_of_the_same_spelling(tmp_path: Path) -> None:
    (tmp_path / "org").mkdir()
    safetensors_torch.save_file({"x": torch.ones(4)}, str(tmp_path / "org" / "model"))
    run = memlayout("inspect", "--format", "json", "--fail-on", "never", "org/model", cwd=tmp_path)
    assert run.code == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["source"]["path"] == "org/model"
    assert not any("remotely" in note for note in report["source"]["notes"])
