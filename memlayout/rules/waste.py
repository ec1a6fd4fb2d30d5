"""ML3xx: bytes that are stored but never used."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

from memlayout.core.flatten_support import flatten_hint
from memlayout.core.shards import is_sharded, padding_over_ranks, ranks_of
from memlayout.format_bytes import human_bytes
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, rule
from memlayout.severity import Severity


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


_HALF_SHARDED = '''
import textwrap

# A model whose blocks are sharded with FSDP2 and whose root is not.
with open("example.py", "w") as f:
    f.write(textwrap.dedent("""
        import os

        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        def build():
            mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
            torch.manual_seed(0)
            model = torch.nn.Sequential(
                torch.nn.Embedding(32_000, 64),
                torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]),
                torch.nn.Linear(64, 32_000),
            )
            for block in model[1]:
                fully_shard(block, mesh=mesh)
            return model
    """))
'''


@rule(
    "ML302",
    "whole-on-every-rank",
    Severity.WARNING,
    "parameters every rank holds whole while the others are sharded",
    "call `fully_shard(model)` on the root after the blocks, so the parameters no block holds are sharded too",
    """
FSDP2 shards only the parameters of the modules `fully_shard` is applied to, and
of the modules inside them that are not wrapped themselves. Applying it to each
block and not to the root keeps every parameter outside the blocks whole on every
rank: the embeddings, the final norm and the LM head. Their gradients and their
optimizer state are then whole on every rank too, and so is their update: for a
Llama-7B, the two 131M-parameter matrices take 1 GiB in float32 on each rank, and
AdamW's state of them 2 GiB more, where sharding them over 64 ranks would take
1/64 of that. FSDP2's own examples and torchtitan call `fully_shard(model)` last.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "In a model whose parameters are in part sharded by FSDP2, the parameters that every rank holds whole (plain "
        "tensors, or DTensors replicated on every mesh dimension). Under `torchrun` every rank's view is checked; on "
        "one rank (`memlayout.inspect(model)`), that rank's. Buffers are not counted: FSDP2 never shards them."
    ),
    example=RuleExample(
        setup=_HALF_SHARDED,
        command="torchrun --standalone --nproc_per_node 2 -m memlayout inspect example:build",
        fixed='''
with open("example.py") as f:
    source = f.read()
with open("example.py", "w") as f:  # the root wrapped too, after the blocks
    f.write(source.replace("    return model", "    fully_shard(model, mesh=mesh)\\n    return model"))
''',
    ),
)
def whole_on_every_rank(ctx: RuleContext) -> Iterator[Finding]:
    facts = ctx.facts
    if facts.world_size < 2 or not any(s.fsdp and is_sharded(s.placements) for s in facts.shards):
        return
    ranks = ranks_of(facts)
    whole_everywhere = dict(ranks[0].whole)
    for other in ranks[1:]:
        held = dict(other.whole)
        whole_everywhere = {name: size for name, size in whole_everywhere.items() if name in held}
    if not whole_everywhere:
        return
    names = sorted(whole_everywhere, key=lambda n: (-whole_everywhere[n], n))
    each = sum(whole_everywhere.values())
    wasted = each * (facts.world_size - 1)
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    view = "each of" if facts.ranks else "this rank, and so each of"
    yield whole_on_every_rank.finding(
        names,
        f"{shown} ({human_bytes(each)}) are held whole by {view} the {facts.world_size} ranks while the other "
        f"parameters are sharded: {human_bytes(wasted)} more over the ranks than one sharded copy, before their "
        "gradients and optimizer state",
        wasted_bytes=wasted,
    )


_UNEVEN_SHARDS = '''
import textwrap

# A parameter whose dimension 0 (3 rows) does not divide by the 2 ranks.
with open("example.py", "w") as f:
    f.write(textwrap.dedent("""
        import os

        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        def build():
            mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
            model = torch.nn.Embedding(3, 2**19)  # 3 rows of 2 MiB
            fully_shard(model, mesh=mesh)
            return model
    """))
'''


@rule(
    "ML303",
    "shard-padding",
    Severity.WARNING,
    "FSDP2 pads a parameter's shards because its dimension 0 does not divide by the ranks",
    "shard a dimension the ranks divide, with `fully_shard(..., shard_placement_fn=...)` returning `Shard(d)` "
    "for this parameter, or pad dimension 0 to a multiple of the number of ranks",
    """
FSDP2 splits dimension 0 of each parameter into `torch.chunk` pieces, one per
rank, and gives every rank a buffer the size of the largest piece. When the ranks
do not divide dimension 0, the buffers are padded: the padding takes memory on
every rank, and is gathered before every forward and backward and reduced after
it with the rest. It is worst where dimension 0 is small: 8 experts stacked on
dimension 0 and sharded over 64 ranks give 8 ranks one expert each and 56 ranks a
buffer holding nothing, 8 times the experts' bytes in all.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "A parameter sharded by FSDP2 whose pieces are padded by `min-shard-padding-bytes` (1 MiB) or more over all "
        "the ranks of its mesh: the padding every rank's buffer holds past its own piece, summed."
    ),
    example=RuleExample(
        setup=_UNEVEN_SHARDS,
        command="torchrun --standalone --nproc_per_node 2 -m memlayout inspect example:build",
        fixed='''
with open("example.py") as f:
    source = f.read()
with open("example.py", "w") as f:  # shard dimension 1, which 2 ranks divide
    f.write(source.replace("fully_shard(model, mesh=mesh)",
                           "fully_shard(model, mesh=mesh, shard_placement_fn=lambda p: Shard(1))")
                  .replace("import fully_shard", "import fully_shard\\nfrom torch.distributed.tensor import Shard"))
''',
    ),
)
def shard_padding(ctx: RuleContext) -> Iterator[Finding]:
    ranks = ctx.facts.ranks
    for shard in ctx.facts.shards:
        if ranks:
            padding = sum(s.padding_bytes for rank in ranks for s in rank.shards if s.name == shard.name)
        else:
            padding = padding_over_ranks(shard)
        if padding < max(ctx.config.min_shard_padding_bytes, 1):
            continue
        ways = prod(shard.mesh_shape)
        rows = shard.global_shape[0] if shard.global_shape else 1
        divisible = [d for d, size in enumerate(shard.global_shape) if d and size % ways == 0]
        fix = (f"shard dimension {divisible[0]} ({shard.global_shape[divisible[0]]}, which {ways} ranks divide) with "
               f"`fully_shard(..., shard_placement_fn=...)` returning `Shard({divisible[0]})` for it"
               if divisible else "shard a dimension the ranks divide")
        yield shard_padding.finding(
            (shard.name,),
            f"{shard.name} {list(shard.global_shape)} is sharded over {ways} ranks on dimension 0, which has {rows} "
            f"rows: FSDP2 pads the ranks' pieces by {human_bytes(padding)} in all",
            wasted_bytes=padding,
            hint=f"{fix}, or pad dimension 0 ({rows}) to a multiple of {ways}",
        )
