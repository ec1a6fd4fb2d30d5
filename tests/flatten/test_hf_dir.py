"""flatten on Hugging Face model directories: each weight file flattened, the rest copied."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import memlayout
from memlayout.cli.app import app

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def save_tiny_gpt2(directory: Path, safe: bool, shard: str | None) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    if safe:
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(directory, **kwargs)
        return model
    # transformers 5 writes only safetensors; write pytorch_model.bin the way
    # transformers 4 did: torch.save shards plus an index naming each tensor's shard.
    directory.mkdir()
    config.save_pretrained(directory)
    # Like transformers 4, store a tie once: the head is rebuilt from the embedding.
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if shard is None:
        torch.save(state, directory / "pytorch_model.bin")
        return model
    names = list(state)
    halves = {"pytorch_model-00001-of-00002.bin": names[: len(names) // 2],
              "pytorch_model-00002-of-00002.bin": names[len(names) // 2 :]}
    weight_map = {}
    for file, part in halves.items():
        torch.save({n: state[n] for n in part}, directory / file)
        weight_map.update(dict.fromkeys(part, file))
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return model


def state_of(directory: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in sorted(directory.iterdir()):
        if file.suffix == ".safetensors":
            state.update(load_file(file))
        elif file.suffix == ".bin":
            state.update(torch.load(file, weights_only=True))
    return state


@pytest.mark.parametrize(("safe", "shard"), [(True, "40KB"), (True, None), (False, "40KB"), (False, None)])
def test_directory_flatten_keeps_every_tensor_and_every_other_file(
    tmp_path: Path, safe: bool, shard: str | None
) -> None:
    source, out = tmp_path / "model", tmp_path / "flat"
    save_tiny_gpt2(source, safe, shard)
    result = CliRunner().invoke(app, ["flatten", str(source), "-o", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in source.iterdir())
    assert json.loads((out / "config.json").read_text()) == json.loads((source / "config.json").read_text())
    before, after = state_of(source), state_of(out)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(tensor.view(torch.uint8), after[name].view(torch.uint8)), name
    found_before = {f.code for f in memlayout.inspect(str(source)).findings}
    found_after = {f.code for f in memlayout.inspect(str(out)).findings}
    assert not {"ML201", "ML301", "ML102", "ML103"} & found_after
    assert found_after <= found_before
    # A flat directory stays as it is.
    assert CliRunner().invoke(app, ["flatten", str(out), "--check"]).exit_code == 0


def test_directory_check_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "model"
    save_tiny_gpt2(source, safe=False, shard=None)
    listing = sorted(p.name for p in source.iterdir())
    result = CliRunner().invoke(app, ["flatten", str(source), "--check"])
    assert result.exit_code in (0, 1)
    assert sorted(p.name for p in source.iterdir()) == listing
    assert not list(tmp_path.glob(".memlayout-*"))


def test_directory_with_a_missing_shard_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "model"
    save_tiny_gpt2(source, safe=True, shard="40KB")
    next(source.glob("model-00001-*.safetensors")).unlink()
    result = CliRunner().invoke(app, ["flatten", str(source), "-o", str(tmp_path / "flat")])
    assert result.exit_code == 2
    assert "missing" in result.stderr
    assert not (tmp_path / "flat").exists()
