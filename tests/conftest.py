"""Shared test options. Golden files are rewritten only on request: `pytest --overwrite`."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--overwrite", action="store_true", default=False, help="rewrite golden files instead of comparing"
    )


@pytest.fixture
def overwrite_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--overwrite"))


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
