"""The `nginx` fixture: one real nginx per test session (tests/remote/nginx.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.remote.nginx import Server, start_nginx


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """nginx on 127.0.0.1 serving a folder of its own; skips with one line where nginx is not installed."""
    yield from start_nginx(tmp_path_factory.mktemp("nginx"))
