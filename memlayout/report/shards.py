"""A sharded model's ranks in the inspect report: each rank's totals, and this rank's pieces."""

from __future__ import annotations

from typing import Any

from memlayout.core.facts import Facts
from memlayout.core.shards import ranks_of
from memlayout.format_bytes import human_bytes


def ranks_entries(facts: Facts) -> list[dict[str, Any]]:
    """`ranks` of the JSON report: every rank's totals under torchrun, this rank's alone on one."""
    return [
        {"rank": r.rank, "tensor_bytes": r.tensor_bytes, "storage_bytes": r.storage_bytes,
         "padding_bytes": r.padding_bytes}
        for r in ranks_of(facts)
    ]


def shard_entries(facts: Facts) -> list[dict[str, Any]]:
    """`shards` of the JSON report: where each of this rank's pieces sits in its whole tensor."""
    return [
        {"name": s.name, "placements": list(s.placements), "mesh_shape": list(s.mesh_shape),
         "global_shape": list(s.global_shape), "local_shape": list(s.local_shape),
         "global_offset": list(s.global_offset), "fsdp": s.fsdp, "padding_bytes": s.padding_bytes}
        for s in facts.shards
    ]


def ranks_line(facts: Facts) -> str | None:
    """One line for the table: the ranks and what each holds; None for a model that is not sharded."""
    ranks = ranks_of(facts)
    if not ranks:
        return None
    view = "each rank" if facts.ranks else f"rank {facts.rank} of {facts.world_size} (this rank's view)"
    held = "; ".join(
        f"{r.rank}: {human_bytes(r.tensor_bytes)} in {human_bytes(r.storage_bytes)}"
        + (f", {human_bytes(r.padding_bytes)} padding" if r.padding_bytes else "")
        for r in ranks[:8]
    )
    more = f"; {len(ranks) - 8} more ranks in --format json" if len(ranks) > 8 else ""
    return f"{view}: {held}{more} ({len(facts.shards)} sharded tensors on rank {facts.rank})"
