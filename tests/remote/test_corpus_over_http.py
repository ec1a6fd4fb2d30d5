"""The real-world corpus (tests/realworld) read over HTTP: the disk's report, or a one-line refusal for local-only
formats."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.realworld.conftest import realworld  # noqa: F401  (the fixture)
from tests.realworld.corpus import CORPUS
from tests.remote.nginx import Server
from tests.remote.reports import memlayout, same_report_remotely

# What a remote read reads; the other formats need the whole file, or are code.
READ_REMOTELY = {"torch-zip", "safetensors"}


@pytest.mark.parametrize("name", [entry.name for entry in CORPUS])
def test_a_corpus_checkpoint_over_http(name: str, realworld: Callable[[str], Path], nginx: Server) -> None:  # noqa: F811
    local = realworld(name)
    served = nginx.root / "files" / "corpus" / f"{name}-{local.name}"
    served.parent.mkdir(exist_ok=True)
    shutil.copyfile(local, served)
    url = f"{nginx.url}/files/corpus/{served.name}"
    on_disk = memlayout("inspect", "--format", "json", "--fail-on", "never", str(local))
    assert on_disk.code == 0, on_disk.stderr
    if json.loads(on_disk.stdout)["source"]["format"] in READ_REMOTELY:
        same_report_remotely(str(local), url)
    else:
        run = memlayout("inspect", url)
        assert run.code == 2 and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1 and "local files only" in run.stderr, run.stderr
