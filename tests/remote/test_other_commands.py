"""activations and flatten meet remote targets: a config fetched alone, and local-only commands refusing URLs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.remote.nginx import Server
from tests.remote.reports import memlayout

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_config(nginx: Server) -> Path:
    folder = nginx.root / "files" / "config-only"
    folder.mkdir()
    transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32).save_pretrained(folder)
    return folder


def _activations(target: str) -> dict[str, object]:
    run = memlayout("activations", "--format", "json", "--input", "int64[2,16]<128", target)
    assert run.code == 0, run.stderr
    report: dict[str, object] = json.loads(run.stdout)
    report.pop("target", None)
    return report


def test_activations_builds_from_a_remote_config_as_from_a_local_one(nginx: Server, gpt2_config: Path) -> None:
    mark = nginx.log_mark()
    remote = _activations(f"{nginx.url}/files/config-only/config.json")
    assert [r.uri for r in nginx.requests_since(mark)] == ["/files/config-only/config.json"]
    assert remote == _activations(str(gpt2_config / "config.json"))


def test_trust_never_reaches_a_remote_config(nginx: Server, gpt2_config: Path) -> None:
    folder = nginx.root / "files" / "remote-code"
    shutil.copytree(gpt2_config, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    for extra in ((), ("--trust",)):
        run = memlayout("activations", *extra, f"{nginx.url}/files/remote-code/config.json")
        assert run.code == 2 and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--trust does not reach remote files" in run.stderr


def test_flatten_reads_local_files_only(nginx: Server, tmp_path: Path) -> None:
    # flatten's --trust unpickles for real; a URL is refused before anything is fetched.
    mark = nginx.log_mark()
    run = memlayout("flatten", "--trust", f"{nginx.url}/files/anything.pt", "-o", str(tmp_path / "out.pt"))
    assert run.code == 2 and "reads local files only" in run.stderr
    assert nginx.requests_since(mark) == []
