"""The `nginx` fixture: one real nginx per test session (tests/remote/nginx.py); the model folders a Hub audit reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.remote.nginx import Server, start_nginx


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """nginx on 127.0.0.1 serving a folder of its own; skips with one line where nginx is not installed."""
    yield from start_nginx(tmp_path_factory.mktemp("nginx"))


@pytest.fixture(scope="session")
def model_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A one-file, a sharded and a .bin transformers folder (tests/remote/hub_repos.py), written once."""
    pytest.importorskip("transformers")
    from tests.remote.hub_repos import write_model_folders

    return write_model_folders(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def local_model_reports(model_folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Each folder's report from disk, as a remote read of it must be."""
    from tests.remote.hub_repos import local_reports

    return local_reports(model_folders)
