"""The corpus is what it claims to be: pinned bytes from other projects' wheels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.realworld.corpus import CORPUS, _sha256


@pytest.mark.parametrize("entry", CORPUS, ids=[e.name for e in CORPUS])
def test_corpus_file_matches_its_pinned_digest(entry, realworld: Callable[[str], Path]) -> None:
    path = realworld(entry.name)
    assert _sha256(path) == entry.sha256
