"""How a command-line path is told apart: local, URL, hf://, or a bare Hub id (no request is made here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memlayout.load.remote_location import remote_location


@pytest.mark.parametrize(
    ("given", "protocol", "repo", "revision", "path_in_repo"),
    [
        ("hf://org/name", "hf", "org/name", "main", ""),
        ("hf://org/name@v1.0", "hf", "org/name", "v1.0", ""),
        ("hf://org/name@abc123/sub/model.safetensors", "hf", "org/name", "abc123", "sub/model.safetensors"),
        ("hf://org/name/config.json", "hf", "org/name", "main", "config.json"),
        ("org/name", "hf", "org/name", "main", ""),
        ("gpt2", "hf", "gpt2", "main", ""),
        ("Qwen/Qwen2.5-0.5B", "hf", "Qwen/Qwen2.5-0.5B", "main", ""),
    ],
)
def test_hub_spellings(
    given: str, protocol: str, repo: str, revision: str, path_in_repo: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    location = remote_location(given)
    assert location is not None
    assert (location.protocol, location.repo, location.revision, location.path_in_repo) == (
        protocol, repo, revision, path_in_repo,
    )


@pytest.mark.parametrize("url", ["https://host/m.safetensors", "http://127.0.0.1:8/x", "s3://bucket/key.pt"])
def test_urls_keep_their_scheme(url: str) -> None:
    location = remote_location(url)
    assert location is not None and location.url == url and location.protocol == url.split(":")[0]


@pytest.mark.parametrize(
    "local",
    ["model.pt", "missing/model.safetensors", "dir/config.json", "pkg.module:build", "../up/name", "a/b/c",
     "file:///tmp/x.pt", "weights.bin"],
)
def test_what_stays_local(local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A missing name that ends like a file, a spec, or a deeper path is never sent to the Hub.
    monkeypatch.chdir(tmp_path)
    assert remote_location(local) is None


def test_an_existing_local_path_wins_over_a_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").write_bytes(b"x")
    assert remote_location("org/name") is None
    assert remote_location("org/other") is not None
