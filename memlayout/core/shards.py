"""What one rank of a sharded model holds, from its facts: the record the ranks share under torchrun."""

from __future__ import annotations

from math import prod

from memlayout.core.facts import Facts
from memlayout.load.records import RankRecord, ShardRecord, TensorKind


def is_sharded(placements: tuple[str, ...]) -> bool:
    """Some mesh dimension splits the tensor ("Shard(dim=0)", "_StridedShard(...)"); "Replicate()" does not."""
    return any("Shard" in placement for placement in placements)


def rank_record(facts: Facts) -> RankRecord:
    """This rank's totals, its pieces, and the parameters it holds whole."""
    pieces = {shard.name: shard for shard in facts.shards}
    whole = tuple(
        (tensor.name, tensor.nbytes)
        for tensor in facts.tensors
        if tensor.kind is TensorKind.PARAMETER and not any(
            name in pieces and is_sharded(pieces[name].placements) for name in tensor.names
        )
    )
    return RankRecord(
        rank=facts.rank,
        tensor_bytes=sum(t.nbytes for t in facts.tensors),
        storage_bytes=sum(s.nbytes for s in facts.storages),
        padding_bytes=sum(shard.padding_bytes for shard in facts.shards),
        shards=facts.shards,
        whole=whole,
    )


def ranks_of(facts: Facts) -> tuple[RankRecord, ...]:
    """Every rank's record when the ranks shared them, else this rank's own (when it holds pieces)."""
    if facts.ranks:
        return facts.ranks
    return (rank_record(facts),) if facts.shards else ()


def padding_over_ranks(shard: ShardRecord) -> int:
    """FSDP2's padding of one tensor summed over every rank of its mesh, from one rank's piece.

    FSDP2 gives every rank a buffer of the largest piece's size, so the ranks hold
    that buffer once per rank of the mesh, against the tensor's bytes once per
    replica (mesh dimensions that replicate it rather than split it).
    """
    if not shard.fsdp:
        return 0
    buffer = prod(shard.local_shape) * shard.itemsize + shard.padding_bytes
    replicas = prod(size for size, placement in zip(shard.mesh_shape, shard.placements, strict=False)
                    if not is_sharded((placement,)))
    return max(buffer * prod(shard.mesh_shape) - prod(shard.global_shape) * shard.itemsize * replicas, 0)
