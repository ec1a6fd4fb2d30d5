"""inspect -> flatten -> flatten --check -> inspect -> diff on a sharded model directory (issue 40).

A user with a sharded safetensors directory was told "21 model tensors spread over
7 storages; flatten would use 1", ran `memlayout flatten`, got 7 storages (one per
shard), `flatten --check` called the result flat and `inspect` said ML204 again.
flatten rewrites each weight file on its own, so that every shard keeps its tensors
and the index stays true: a finding's count must be what its hint does, the finding
must be gone once the hint is followed, and every command must give the same count.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")

def memlayout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memlayout", *args], capture_output=True, text=True, timeout=300)


def _sharded_gpt2(tmp_path: Path, weights: str) -> tuple[Path, int]:
    """A small GPT-2 saved by save_pretrained in safetensors shards, or as transformers 4 saved .bin shards;
    and how many shards."""
    import transformers
    from safetensors.torch import load_file

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    directory = tmp_path / "gpt2_st"
    transformers.GPT2LMHeadModel(config).save_pretrained(directory, max_shard_size="70KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 4, shards
    if weights == "safetensors":
        return directory, len(shards)
    # transformers 5 writes only safetensors; transformers 4 wrote the same shards with
    # torch.save, named pytorch_model-0000N-of-0000M.bin, and an index naming them.
    binary = tmp_path / "gpt2_bin"
    binary.mkdir()
    weight_map = {}
    for number, shard in enumerate(shards, 1):
        name = f"pytorch_model-{number:05d}-of-{len(shards):05d}.bin"
        state = load_file(directory / shard)
        torch.save(state, binary / name)
        weight_map.update(dict.fromkeys(state, name))
    (binary / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (binary / "config.json").write_text((directory / "config.json").read_text())
    return binary, len(shards)


def _inspected(path: Path) -> dict[str, Any]:
    done = memlayout("inspect", str(path), "--format", "json", "--isolated", "--fail-on", "never")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _storages_after_check(path: Path) -> tuple[int, int]:
    """(storages now, storages after flatten) as `flatten --check` reports them (ML204 is info: --fail-on info)."""
    done = memlayout("flatten", "--check", str(path), "--fail-on", "info")
    flat = re.search(r": already flat \((\d+) storages?\)", done.stdout)
    if flat:
        assert done.returncode == 0, done.stdout + done.stderr
        return int(flat[1]), int(flat[1])
    assert done.returncode == 1, done.stdout + done.stderr
    counted = re.search(r"^  storages  (\d+) -> (\d+)$", done.stdout, re.M)
    assert counted, done.stdout
    return int(counted[1]), int(counted[2])


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
def test_ml204_counts_what_flatten_does_and_is_gone_after_it(tmp_path: Path, weights: str) -> None:
    directory, shards = _sharded_gpt2(tmp_path, weights)
    report = _inspected(directory)
    before = report["summary"]["storages"]
    fragmented = [f for f in report["findings"] if f["code"] == "ML204"]

    out = tmp_path / "flat"
    flattened = memlayout("flatten", str(directory), "-o", str(out))
    assert flattened.returncode == 0, flattened.stderr
    counted = re.search(r"^  storages  (\d+) -> (\d+)$", flattened.stdout, re.M)
    assert counted and int(counted[1]) == before, flattened.stdout
    after = int(counted[2])
    # Each shard keeps its tensors, so flatten never leaves fewer storages than files.
    assert after >= shards

    if weights == "bin":
        # torch.save stores each tensor alone: 28 storages, which flatten makes one per file.
        assert len(fragmented) == 1, report["findings"]
        assert fragmented[0]["message"].endswith(f"spread over {before} storages; flatten would use {after}")
        assert "`memlayout flatten`" in fragmented[0]["hint"], fragmented[0]["hint"]
    else:
        # A safetensors shard is one data section, one storage: nothing for flatten to merge.
        assert after == before == shards
        assert not fragmented, fragmented
    assert _storages_after_check(directory) == (before, after)

    flat_report = _inspected(out)
    assert "ML204" not in {f["code"] for f in flat_report["findings"]}, flat_report["findings"]
    assert flat_report["summary"]["storages"] == after
    assert _storages_after_check(out) == (after, after)

    diffed = memlayout("diff", str(directory), str(out), "--format", "json", "--fail-on", "never")
    assert diffed.returncode == 0, diffed.stderr
    sides = json.loads(diffed.stdout)
    assert (sides["a"]["summary"]["storages"], sides["b"]["summary"]["storages"]) == (before, after)
    assert sides["b"]["summary"]["findings"] == flat_report["summary"]["findings"]
