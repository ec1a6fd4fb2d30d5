"""ML3xx: bytes that are stored but never used."""

from __future__ import annotations

from collections.abc import Iterator

from memlayout.core.flatten_support import flatten_hint
from memlayout.format_bytes import human_bytes
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, Severity, rule


@rule(
    "ML301",
    "storage-bloat",
    Severity.WARNING,
    "tensors use only part of their storage, and saving writes the whole storage",
    "save `.clone()` of the slice (or run `memlayout flatten`), which copies only the used bytes",
    """
`torch.save` writes every storage whole, so a small slice of a big tensor drags
the big tensor onto disk: a 10-element slice of a 1M-element float32 tensor saves
as 4 MB (pytorch/pytorch #1995, #40157), and loading it allocates the whole
storage again.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "`min-bloat-bytes` (1 KiB) or more of a storage that no tensor uses, alignment padding "
        "between slots not counted."
    ),
    example=RuleExample(
        setup="""
import torch

big = torch.randn(1_000_000)
torch.save({"head": big[:10]}, "model.pt")  # 4 MB on disk for 40 bytes
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"head": big[:10].clone()}, "model.pt")  # 1.5 KB
""",
    ),
)
def storage_bloat(ctx: RuleContext) -> Iterator[Finding]:
    hint = ""
    for storage in ctx.facts.storages:
        if storage.unused_bytes >= ctx.config.min_bloat_bytes and storage.unused_bytes > 0:
            # Made at the first finding, once: it depends only on the source.
            hint = hint or (
                f"save `.clone()` of the slice (or {flatten_hint(ctx.facts.source)}), which copies only the used bytes"
            )
            share = storage.used_bytes / storage.nbytes if storage.nbytes else 0.0
            yield storage_bloat.finding(
                storage.tensors,
                f"storage {storage.id} is {human_bytes(storage.nbytes)} but its tensors "
                f"({', '.join(storage.tensors[:3])}{', ...' if len(storage.tensors) > 3 else ''}) "
                f"use {share:.1%}; {human_bytes(storage.unused_bytes)} wasted",
                storage=storage.id,
                wasted_bytes=storage.unused_bytes,
                hint=hint,
            )
