"""Sharded transformers directories over HTTP and on a Hub served by nginx (HF_ENDPOINT): the disk's report."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.remote.nginx import Server
from tests.remote.reports import REPO, json_report, memlayout, same_report_remotely

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HUB_REPO = "tiny-org/tiny-gpt2"


def _tiny_gpt2() -> object:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def model_dirs(nginx: Server) -> dict[str, Path]:
    """The same tiny GPT-2 saved by transformers as sharded safetensors and as sharded .bin files."""
    model = _tiny_gpt2()
    files = nginx.root / "files"
    dirs = {"safetensors": files / "gpt2-safetensors", "bin": files / "gpt2-bin"}
    model.save_pretrained(dirs["safetensors"], max_shard_size="20KB")  # type: ignore[attr-defined]
    # transformers no longer writes .bin shards; torch.save writes them as older transformers did.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]
    names = sorted(state)
    dirs["bin"].mkdir()
    weight_map = {}
    for index in range(4):
        shard = f"pytorch_model-{index + 1:05d}-of-00004.bin"
        torch.save({name: state[name] for name in names[index::4]}, dirs["bin"] / shard)
        weight_map.update({name: shard for name in names[index::4]})
    (dirs["bin"] / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(dirs["safetensors"] / "config.json", dirs["bin"] / "config.json")
    return dirs


GUIDE_COMMAND = re.search(
    r"^\$ memlayout (inspect hf://(\S+))$", (REPO / "docs" / "remote.md").read_text(), re.MULTILINE
)


def serve_as_hub_repository(nginx: Server, source: Path, repo: str) -> None:
    """A folder as a Hub repository: the tree API's JSON, and the files `resolve` redirects to."""
    shutil.copytree(source, nginx.root / "hub" / repo / "main")
    listing = [
        {"type": "file", "path": p.name, "size": p.stat().st_size, "oid": f"{i:040x}"}
        for i, p in enumerate(sorted(source.iterdir()))
    ]
    tree = nginx.root / "api" / "models" / repo / "tree"
    tree.mkdir(parents=True)
    (tree / "main").write_text(json.dumps(listing))


@pytest.fixture(scope="module")
def hub(nginx: Server, model_dirs: dict[str, Path]) -> dict[str, str]:
    """The safetensors directory as the Hub repository HUB_REPO, and as the remote guide's repository."""
    serve_as_hub_repository(nginx, model_dirs["safetensors"], HUB_REPO)
    assert GUIDE_COMMAND is not None, "docs/remote.md shows one remote command"
    serve_as_hub_repository(nginx, model_dirs["safetensors"], GUIDE_COMMAND.group(2))
    return {"HF_ENDPOINT": nginx.url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"}


def test_the_remote_guides_command_runs_against_the_hubs_layout(hub: dict[str, str]) -> None:
    assert GUIDE_COMMAND is not None
    run = memlayout(*shlex.split(GUIDE_COMMAND.group(1)), env=hub)
    assert run.code in (0, 1), run.stderr
    assert "read remotely" in run.stdout


def test_a_sharded_safetensors_directory_by_its_index_url(nginx: Server, model_dirs: dict[str, Path]) -> None:
    folder = model_dirs["safetensors"]
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) > 3
    url = f"{nginx.url}/files/{folder.name}/model.safetensors.index.json"
    same_report_remotely(str(folder), url)


def test_a_sharded_directory_fetches_its_index_config_and_headers_only(
    nginx: Server, model_dirs: dict[str, Path]
) -> None:
    folder = model_dirs["safetensors"]
    needed = (folder / "model.safetensors.index.json").stat().st_size + (folder / "config.json").stat().st_size
    shards = sorted(folder.glob("*.safetensors"))
    header_end = {shard.name: 8 + int.from_bytes(shard.read_bytes()[:8], "little") for shard in shards}
    needed += sum(header_end.values())
    mark = nginx.log_mark()
    json_report(f"{nginx.url}/files/{folder.name}/model.safetensors.index.json")
    logged = nginx.requests_since(mark)
    assert sum(r.body_bytes for r in logged) >= needed
    assert all(r.status in (200, 206) for r in logged)
    # Each shard is asked once, for a length its tensor names in the index make, so no
    # shard waits for another's header: config, index, then one range per shard.
    shard_requests = [r for r in logged if r.uri.rsplit("/", 1)[1] in header_end]
    assert sorted(r.uri.rsplit("/", 1)[1] for r in shard_requests) == sorted(header_end)
    assert len(logged) == len(shards) + 2
    # No reply of a shard runs more than a fifth past its header: tensor bytes are never the point.
    for request in shard_requests:
        name = request.uri.rsplit("/", 1)[1]
        assert header_end[name] <= request.body_bytes <= header_end[name] * 1.2, request


def test_a_sharded_bin_directory_by_its_index_url(nginx: Server, model_dirs: dict[str, Path]) -> None:
    folder = model_dirs["bin"]
    assert len(list(folder.glob("*.bin"))) > 3
    url = f"{nginx.url}/files/{folder.name}/pytorch_model.bin.index.json"
    same_report_remotely(str(folder), url)


def test_an_hf_url_reads_the_repository_as_a_model_directory(
    nginx: Server, model_dirs: dict[str, Path], hub: dict[str, str]
) -> None:
    mark = nginx.log_mark()
    same_report_remotely(str(model_dirs["safetensors"]), f"hf://{HUB_REPO}", env=hub)
    uris = [r.uri for r in nginx.requests_since(mark)]
    # The Hub's own URLs, as huggingface_hub and the Hub's resolve redirects make them.
    assert any(uri.startswith(f"/api/models/{HUB_REPO}/tree/main") for uri in uris)
    assert any(uri.startswith(f"/{HUB_REPO}/resolve/main/") for uri in uris)


def test_a_bare_hub_id_reads_the_repository_when_no_local_path_has_its_name(
    model_dirs: dict[str, Path], hub: dict[str, str]
) -> None:
    same_report_remotely(str(model_dirs["safetensors"]), HUB_REPO, env=hub)


def test_an_hf_url_with_a_revision_and_a_path_reads_one_file(
    nginx: Server, model_dirs: dict[str, Path], hub: dict[str, str]
) -> None:
    shard = sorted(model_dirs["safetensors"].glob("*.safetensors"))[0]
    same_report_remotely(str(shard), f"hf://{HUB_REPO}@main/{shard.name}", env=hub)


def test_a_missing_hub_repository_is_one_line_with_the_token_hint(hub: dict[str, str]) -> None:
    run = memlayout("inspect", "hf://tiny-org/no-such-model", env=hub)
    assert run.code == 2 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert "tiny-org/no-such-model" in run.stderr and "HF_TOKEN" in run.stderr


def test_a_missing_revision_is_one_line(hub: dict[str, str]) -> None:
    run = memlayout("inspect", f"hf://{HUB_REPO}@no-such-branch", env=hub)
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_diff_compares_a_remote_model_with_its_local_copy(
    nginx: Server, model_dirs: dict[str, Path], hub: dict[str, str]
) -> None:
    run = memlayout("diff", str(model_dirs["safetensors"]), f"hf://{HUB_REPO}", env=hub)
    assert run.code == 0, run.stderr
