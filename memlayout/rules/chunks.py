"""ML106: a tensor stored in pieces whose pieces cover the same elements twice (aliasing, ML1xx).

The aliasing family's other rules read storages (`aliasing.py`); this one reads
the chunks a torch.distributed.checkpoint lists for each tensor, which DCP's
metadata records and its own save planner checks: `_validate_global_plan`
refuses chunks that overlap ("Failed to validate global plan: ... has
overlapping chunks"). A planner that skips that check, or keeps every rank's
copy of a replicated tensor, writes them anyway, and dcp.load reads them all.
"""

from __future__ import annotations

from collections.abc import Iterator

from memlayout.dtypes import dtype_info
from memlayout.load.records import ChunkRecord
from memlayout.rules.registry import Finding, RuleContext, RuleExample, rule
from memlayout.severity import Severity

_SHOWN = 4


def _box(chunk: ChunkRecord) -> str:
    return "[" + ",".join(f"{o}:{o + s}" for o, s in zip(chunk.offsets, chunk.sizes, strict=False)) + "]"


def _where(chunk: ChunkRecord) -> str:
    return f"{chunk.file} at byte {chunk.byte_offset:,}" if chunk.file else "bytes the metadata does not locate"


def _common(a: ChunkRecord, b: ChunkRecord) -> int:
    """Elements the two boxes share (0 when they do not meet)."""
    count = 1
    for start_a, size_a, start_b, size_b in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=False):
        count *= max(0, min(start_a + size_a, start_b + size_b) - max(start_a, start_b))
    return count


def overlapping_pairs(chunks: list[ChunkRecord]) -> Iterator[tuple[int, int, int]]:
    """(i, j, shared elements) for each pair of one tensor's chunks whose boxes meet.

    Sorted on the first dimension and swept, as DCP's validator does, so a tensor
    of thousands of disjoint chunks costs a sort, not a comparison of every pair.
    """
    if not chunks or not chunks[0].offsets:
        return
    order = sorted(range(len(chunks)), key=lambda i: chunks[i].offsets[0])
    active: list[int] = []
    for i in order:
        start = chunks[i].offsets[0]
        active = [j for j in active if chunks[j].offsets[0] + chunks[j].sizes[0] > start]
        for j in active:
            shared = _common(chunks[i], chunks[j])
            if shared:
                yield min(i, j), max(i, j), shared
        active.append(i)


@rule(
    "ML106",
    "overlapping-chunks",
    Severity.ERROR,
    "a checkpoint stores some elements of a tensor in more than one chunk",
    "re-save from the model whose values you mean to keep with DCP's own planner (`dcp.save(model.state_dict(), "
    "checkpoint_id=DIR)`), which writes one copy of each replicated chunk and refuses overlapping ones",
    """
torch.distributed.checkpoint stores each tensor as chunks, each with its offsets
and sizes in the whole tensor. dcp.load reads every stored chunk that meets the
piece the caller asks for and copies each into it in turn, so where two chunks
cover the same elements the values loaded are those of the chunk read last, and
the other chunk's are dropped without a word. When the two are copies of a
replicated tensor whose ranks had drifted apart, the checkpoint holds two
models, and which one comes back depends on the read order. DCP's own save
planner removes duplicate replicas and refuses overlapping chunks; a custom
planner that skips both writes them, and so can another writer of the format.
""",
    detects=(
        "Two chunks of one tensor in a torch.distributed.checkpoint directory whose boxes (offsets "
        "and sizes in the whole tensor, from `.metadata`) share elements: the same chunk listed twice, "
        "or chunks that overlap in part. The shared elements' bytes count as wasted."
    ),
    example=RuleExample(
        setup="""
import os
import pickle

import torch
from torch.distributed.checkpoint import metadata

# What a save planner that keeps two ranks' copies of a replicated weight writes.
box = metadata.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 3]))
weight = metadata.TensorStorageMetadata(metadata.TensorProperties(dtype=torch.float32), torch.Size([4, 3]), [box, box])
os.makedirs("ckpt", exist_ok=True)
with open("ckpt/.metadata", "wb") as out:
    pickle.dump(metadata.Metadata(state_dict_metadata={"w": weight}), out)
""",
        command="memlayout inspect ckpt",
        fixed="""
import torch.distributed.checkpoint as dcp

dcp.save({"w": torch.zeros(4, 3)}, checkpoint_id="ckpt")  # one process: DCP's own planner
""",
    ),
)
def overlapping_chunks(ctx: RuleContext) -> Iterator[Finding]:
    by_name: dict[str, list[ChunkRecord]] = {}
    for chunk in ctx.facts.source.chunks:
        by_name.setdefault(chunk.name, []).append(chunk)
    for name, chunks in by_name.items():
        if len(chunks) < 2:
            continue
        pairs = list(overlapping_pairs(chunks))
        if not pairs:
            continue
        tensor = ctx.facts.tensor(name)
        itemsize = dtype_info(tensor.dtype).itemsize if tensor is not None else 1
        said = []
        for i, j, shared in pairs[:_SHOWN]:
            a, b = chunks[i], chunks[j]
            how = "is listed twice" if (a.offsets, a.sizes) == (b.offsets, b.sizes) else f"overlaps chunk {_box(b)}"
            if (a.file, a.byte_offset) == (b.file, b.byte_offset):
                stored = f"both read from {_where(a)}"
            else:
                stored = f"read from {_where(a)} and from {_where(b)}"
            said.append(f"chunk {_box(a)} {how} ({shared:,} elements, {stored})")
        more = f"; and {len(pairs) - _SHOWN} more pairs" if len(pairs) > _SHOWN else ""
        if all((chunks[i].file, chunks[i].byte_offset) == (chunks[j].file, chunks[j].byte_offset) for i, j, _ in pairs):
            # storage_data is keyed by MetadataIndex, whose equality ignores the index
            # hint: two copies of one chunk collapse to the location written last.
            consequence = (
                ".metadata locates one copy for both (its storage_data keys a chunk by tensor and offsets, not "
                "by its place in the list), so dcp.load reads that copy and never the other"
            )
        else:
            consequence = (
                "dcp.load copies every chunk that meets what it loads, so those elements get the values of the "
                "chunk it reads last"
            )
        yield overlapping_chunks.finding(
            (name,),
            f"{name}: {'; '.join(said)}{more}. {consequence}",
            wasted_bytes=sum(shared for _, _, shared in pairs) * itemsize,
        )
