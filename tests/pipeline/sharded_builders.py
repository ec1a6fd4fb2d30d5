"""Builders that `torchrun ... -m memlayout inspect` calls on every rank: models already sharded with FSDP2.

Each joins the ranks torchrun started through `init_device_mesh`, as a training
script does, and is seeded, so every rank builds the same weights.
"""

from __future__ import annotations

import os

import torch
from torch import nn


def _mesh() -> object:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))


class Padded(nn.Module):
    """An embedding and blocks, and a 3-row table: 3 rows do not split evenly over 2 ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20_000, 64)
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(3)])
        self.table = nn.Parameter(torch.zeros(3, 2**18))
        self.head = nn.Linear(64, 20_000)


def blocks_only() -> nn.Module:
    """Each block sharded, the root left out: the embedding, the table and the head stay whole."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh()
    torch.manual_seed(0)
    model = Padded()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return model


def blocks_and_root() -> nn.Module:
    """The blocks, then the root: everything sharded, and the table's 3 rows padded to 4."""
    from torch.distributed.fsdp import fully_shard

    model = blocks_only()
    fully_shard(model, mesh=model.blocks[0].weight.device_mesh)
    return model


def sized_by_the_world() -> nn.Module:
    """Asks the process group for its size before any mesh exists, as a training script sizing its mesh does."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    for block in model:
        fully_shard(block, mesh=mesh)
    return model


def joins_the_group_itself() -> nn.Module:
    """Calls init_process_group unconditionally, as some training scripts do."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return nn.Linear(4, 4)


def fails_on_rank_1() -> nn.Module:
    """A builder that raises on one rank only (no device there, say)."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1 found no device")
    return nn.Linear(4, 4)


def _rank_0_of_2(root: bool, rows: int) -> nn.Module:
    """Rank 0's view of the model sharded over 2 ranks, in this one process (torch's fake process group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from memlayout.activations.ranks.rank_step import fake_world

    with fake_world(2, 0):
        torch.manual_seed(0)
        model = Padded()
        model.table = nn.Parameter(torch.zeros(rows, 2**18))
        mesh = init_device_mesh("cpu", (2,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        if root:
            fully_shard(model, mesh=mesh)
    return model


def root_left_out_on_rank_0() -> nn.Module:
    return _rank_0_of_2(root=False, rows=3)


def root_wrapped_on_rank_0() -> nn.Module:
    return _rank_0_of_2(root=True, rows=3)


def even_table_on_rank_0() -> nn.Module:
    return _rank_0_of_2(root=True, rows=4)
