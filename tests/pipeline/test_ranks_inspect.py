"""`memlayout inspect` of a model already sharded over ranks: under torchrun with real gloo ranks, and on one rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

import memlayout
from memlayout.activations.ranks.rank_step import fake_world
from memlayout.core.shards import padding_over_ranks

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "memlayout" / "report" / "schema_v1.json").read_text())
BUILDERS = "tests.pipeline.sharded_builders"


def torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc_per_node 2 -m memlayout inspect ...`, as a user types it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "memlayout", "inspect", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False)


@pytest.fixture(scope="module")
def half_sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    folder = tmp_path_factory.mktemp("ranks")
    done = torchrun(f"{BUILDERS}:blocks_only", "--format", "json", "-o", "report.json", cwd=folder)
    return done, json.loads((folder / "report.json").read_text())


def test_rank_0_writes_one_report_of_every_rank(half_sharded: tuple[subprocess.CompletedProcess[str], dict]) -> None:
    done, report = half_sharded
    assert done.stdout == ""  # -o: the report went to the file, from rank 0 alone
    jsonschema.validate(report, SCHEMA)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert rank["tensor_bytes"] > 0 and rank["storage_bytes"] >= rank["tensor_bytes"]
    pieces = {s["name"]: s for s in report["shards"]}
    # Rank 0 holds the first half of each block's rows.
    assert pieces["blocks.0.weight"]["local_shape"] == [32, 64] and pieces["blocks.0.weight"]["global_offset"] == [0, 0]
    assert pieces["blocks.0.weight"]["global_shape"] == [64, 64] and pieces["blocks.0.weight"]["fsdp"]
    assert "embed.weight" not in pieces  # a plain tensor: the root was not wrapped


def test_parameters_left_out_of_fully_shard_are_named_with_the_bytes_they_waste(
    half_sharded: tuple[subprocess.CompletedProcess[str], dict],
) -> None:
    _, report = half_sharded
    (finding,) = [f for f in report["findings"] if f["code"] == "ML302"]
    assert set(finding["tensors"]) == {"embed.weight", "table", "head.weight", "head.bias"}
    whole = (20_000 * 64 + 3 * 2**18 + 64 * 20_000 + 20_000) * 4
    assert finding["wasted_bytes"] == whole * (2 - 1)
    assert "held whole by each of the 2 ranks" in finding["message"]


def test_following_the_hint_shards_them_and_reports_the_padding_it_brings(tmp_path: Path) -> None:
    done = torchrun(f"{BUILDERS}:blocks_and_root", "--format", "json", cwd=tmp_path)
    report = json.loads(done.stdout)
    codes = [f["code"] for f in report["findings"]]
    assert "ML302" not in codes
    # The 3-row table now splits into 2 rows and 1 row, and rank 1's buffer is padded by a row.
    padding = {r["rank"]: r["padding_bytes"] for r in report["ranks"]}
    assert padding == {0: 0, 1: 2**18 * 4}
    (finding,) = [f for f in report["findings"] if f["code"] == "ML303"]
    assert finding["tensors"] == ["table"] and finding["wasted_bytes"] == 2**18 * 4
    assert "Shard(1)" in finding["hint"] and "pad dimension 0 (3) to a multiple of 2" in finding["hint"]
    table = next(s for s in report["shards"] if s["name"] == "table")
    assert table["local_shape"] == [2, 2**18] and table["padding_bytes"] == 0


def test_a_builder_that_asks_for_the_world_size_finds_the_group_joined(tmp_path: Path) -> None:
    # issue 26, defect 9: memlayout joined the ranks' group only after the builder
    # returned, so dist.get_world_size() in the builder raised on every rank.
    done = torchrun(f"{BUILDERS}:sized_by_the_world", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    pieces = {s["name"]: s for s in report["shards"]}
    assert pieces["0.weight"]["local_shape"] == [32, 64] and pieces["0.weight"]["global_shape"] == [64, 64]


def test_a_builder_that_joins_the_group_itself_is_told_memlayout_has_joined_it() -> None:
    # Joining before the builder (above) makes torch refuse a second init_process_group.
    from memlayout.errors import UsageError
    from memlayout.load.import_spec import resolve_spec

    with fake_world(2, 0), pytest.raises(UsageError) as raised:
        resolve_spec(f"{BUILDERS}:joins_the_group_itself")
    assert "default process group twice" in raised.value.message  # torch's own words
    assert "if not dist.is_initialized()" in raised.value.hint


def test_a_builder_that_raises_on_one_rank_is_one_error_line_from_rank_0(tmp_path: Path) -> None:
    done = torchrun(f"{BUILDERS}:fails_on_rank_1", cwd=tmp_path)
    ours = [line for line in done.stderr.splitlines() if line.startswith("memlayout:")]
    assert ours == [ours[0]] and ours[0].startswith("memlayout: error: on rank 1: calling ")
    assert "RuntimeError: rank 1 found no device" in ours[0]
    assert done.stdout == ""
    # Every rank exits 2; torchrun reports its failed workers as it does for any script, and exits 1.
    assert "exitcode  : 2" in done.stderr and done.returncode == 1


def test_inspect_on_one_rank_reports_that_ranks_view() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tests.pipeline.sharded_builders import Padded

    with fake_world(4, 3):
        torch.manual_seed(0)
        model = Padded()
        mesh = init_device_mesh("cpu", (4,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        report = memlayout.inspect(model)
    facts = report.facts
    assert (facts.rank, facts.world_size) == (3, 4)
    pieces = {s.name: s for s in facts.shards}
    # torch.chunk gives ranks 0-2 one row of the 3-row table and rank 3 none: an empty piece in a padded buffer.
    table = pieces["table"]
    assert table.local_shape == (0, 2**18) and table.padding_bytes == 2**18 * 4
    assert pieces["embed.weight"].local_shape == (5_000, 64) and pieces["embed.weight"].global_offset == (15_000, 0)
    # Over the 4 ranks: 4 one-row buffers hold 3 rows, so one row of padding.
    assert padding_over_ranks(table) == 2**18 * 4
    codes = [f.code for f in report.findings]
    assert "ML303" in codes and "ML302" not in codes
    # FSDP2's padding is padding, not a slice saved for nothing (ML301).
    assert "ML301" not in codes
