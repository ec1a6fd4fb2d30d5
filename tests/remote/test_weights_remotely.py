"""`activations --weights` on remote targets: a checkpoint's headers by HTTP ranges, a Hub repository's config,
and the --download hint followed where a server ignores Range. The figures are the local copy's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.remote.nginx import Server
from tests.remote.reports import memlayout
from tests.remote.test_model_directories import serve_as_hub_repository

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HUB_REPO = "tiny-org/weights-gpt2"


@pytest.fixture(scope="module")
def model_dirs(nginx: Server) -> dict[str, Path]:
    """A tiny GPT-2 as sharded safetensors and as sharded .bin files, each with its config.json."""
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    files = nginx.root / "files"
    dirs = {"safetensors": files / "weights-gpt2-safetensors", "bin": files / "weights-gpt2-bin"}
    model.save_pretrained(dirs["safetensors"], max_shard_size="20KB")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(state)
    dirs["bin"].mkdir()
    weight_map = {}
    for index in range(4):
        shard = f"pytorch_model-{index + 1:05d}-of-00004.bin"
        torch.save({name: state[name] for name in names[index::4]}, dirs["bin"] / shard)
        weight_map.update({name: shard for name in names[index::4]})
    (dirs["bin"] / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (dirs["bin"] / "config.json").write_text((dirs["safetensors"] / "config.json").read_text())
    return dirs


@pytest.fixture(scope="module")
def hub(nginx: Server, model_dirs: dict[str, Path]) -> dict[str, str]:
    serve_as_hub_repository(nginx, model_dirs["safetensors"], HUB_REPO)
    return {"HF_ENDPOINT": nginx.url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "0"}


def _weights(target: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run = memlayout("activations", "--weights", "--format", "json", *args, target, env=env)
    assert run.code == 0, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def _figures(report: dict[str, Any]) -> tuple[Any, ...]:
    return report["parameters"], report["buffers"], report["as_built"], report["dtypes"]


@pytest.mark.parametrize("kind, index", [("safetensors", "model.safetensors.index.json"),
                                         ("bin", "pytorch_model.bin.index.json")])
def test_a_sharded_checkpoints_headers_by_its_index_url(
    nginx: Server, model_dirs: dict[str, Path], kind: str, index: str
) -> None:
    folder = model_dirs[kind]
    weights_only = folder.parent / f"{folder.name}-weights-only"
    if not weights_only.exists():  # the local copy without config.json is read from its headers too
        weights_only.mkdir()
        for path in folder.iterdir():
            if path.name != "config.json":
                (weights_only / path.name).write_bytes(path.read_bytes())
    local = _weights(str(weights_only))
    mark = nginx.log_mark()
    remote = _weights(f"{nginx.url}/files/{folder.name}/{index}")
    assert remote["counted_from"] == "the checkpoint's headers"
    assert _figures(remote) == _figures(local)
    shard_bytes = sum(p.stat().st_size for p in folder.iterdir() if p.name != index and p.name != "config.json")
    fetched = sum(r.body_bytes for r in nginx.requests_since(mark))
    assert fetched < shard_bytes / 2, (fetched, shard_bytes)  # headers, not tensors
    # Built from the config beside it: the same parameters as the headers say.
    built = _weights(str(folder))
    assert built["parameters"] == remote["parameters"] and built["dtypes"] == remote["dtypes"]


def test_a_hub_repository_is_built_from_its_config(
    nginx: Server, model_dirs: dict[str, Path], hub: dict[str, str]
) -> None:
    remote = _weights(f"hf://{HUB_REPO}", env=hub)
    assert remote["counted_from"] == "the model built on the meta device"
    assert remote["target"]["class"] == "GPT2LMHeadModel"
    assert _figures(remote) == _figures(_weights(str(model_dirs["safetensors"])))


def test_a_server_that_ignores_range_is_refused_and_the_hints_download_reads_it(
    nginx: Server, model_dirs: dict[str, Path]
) -> None:
    shard = sorted(model_dirs["safetensors"].glob("*.safetensors"))[0]
    url = f"{nginx.url}/norange/{model_dirs['safetensors'].name}/{shard.name}"
    run = memlayout("activations", "--weights", url)
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "pass --download" in run.stderr
    assert _figures(_weights(url, "--download")) == _figures(_weights(str(shard)))
