"""A one-file model folder over plain HTTP, as a new user read one (issue 40, defect 3), against a real nginx.

The user served two GPT-2 folders they made (safetensors from `save_pretrained`,
which drops the tied `lm_head.weight`, and a `.bin` state dict) and compared them.
`diff gpt2_pbin http://host/gpt2_st/model.safetensors` said "error tie-lost": one
file alone has no config.json to say the head is tied, where the local `diff` of
the two folders says "info tie-restored". A URL to the folder's config.json, or the
folder's URL ending in /, now reads the folder. And a folder's URL without the /,
which nginx's listing answers with a web page (200, whatever the Range), was
refused as "the server ignores HTTP Range requests ... downloading all 317 bytes":
it now says it is an HTML page, not a checkpoint, and the hint's URL works.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.remote.nginx import Server
from tests.remote.reports import memlayout

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_folders(nginx: Server) -> dict[str, Path]:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    folders = {"st": nginx.root / "files" / "gpt2_st", "pbin": nginx.root / "files" / "gpt2_pbin"}
    model.save_pretrained(folders["st"])
    folders["pbin"].mkdir()
    torch.save(model.state_dict(), folders["pbin"] / "pytorch_model.bin")
    config.save_pretrained(folders["pbin"])
    return folders


def diff(a: str, b: str) -> tuple[int, dict[str, Any]]:
    run = memlayout("diff", "--format", "json", a, b)
    assert run.code in (0, 1), run.stderr
    return run.code, json.loads(run.stdout)


def kinds(report: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((change["kind"], change["severity"]) for change in report["changes"])


def test_a_folders_config_url_reads_the_folder_as_diff_does_on_disk(
    nginx: Server, gpt2_folders: dict[str, Path]
) -> None:
    code, on_disk = diff(str(gpt2_folders["pbin"]), str(gpt2_folders["st"]))
    assert ("tie-restored", "info") in kinds(on_disk)
    for url in (f"{nginx.url}/files/gpt2_st/config.json", f"{nginx.url}/files/gpt2_st/"):
        remote_code, remote = diff(str(gpt2_folders["pbin"]), url)
        assert (remote_code, kinds(remote)) == (code, kinds(on_disk)), url
        assert ("tie-lost", "error") not in kinds(remote)


def test_a_folder_url_answered_with_a_listing_says_html_and_its_hint_works(
    nginx: Server, gpt2_folders: dict[str, Path]
) -> None:
    run = memlayout("inspect", f"{nginx.url}/listing/gpt2_st")
    assert run.code == 2 and "Traceback" not in run.stderr
    (line,) = run.stderr.splitlines()
    assert "an HTML page" in line and "not a checkpoint" in line
    assert "ignores HTTP Range" not in line
    assert "or of the folder ending in /" in line
    # The hint, followed: the folder's URL ending in /.
    followed = memlayout("inspect", "--format", "json", "--fail-on", "never", f"{nginx.url}/listing/gpt2_st/")
    assert followed.code == 0, followed.stderr
    assert json.loads(followed.stdout)["source"]["format"] == "hf-safetensors"
