"""ML2xx: how a tensor's bytes are laid out: order, alignment, fragmentation."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from memlayout.core.facts import TensorFact
from memlayout.core.flat_groups import flat_layout_phrase, storages_after_flatten
from memlayout.core.flatten_support import (
    alignment_hint,
    file_alignment,
    flatten_hint,
    stores_back_to_back,
)
from memlayout.core.strides import MemoryFormat, Relation
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, rule
from memlayout.severity import Severity

ALIGNMENT = 16


def _views_equal_to_a_dense_view(ctx: RuleContext) -> set[str]:
    """Views covering exactly the bytes of a dense (not strided) view of their storage.

    A transposed tie (`decoder.weight = encoder.weight.t()`) is strided by design.
    One pass over the alias pairs, not a scan of every alias group per strided
    tensor, which at 40,000 transposed ties made ML201 quadratic.
    """
    deliberate: set[str] = set()
    for group in ctx.facts.alias_groups:
        for pair in group.pairs:
            if pair.relation is not Relation.EQUAL:
                continue
            for name, other_name in ((pair.first, pair.second), (pair.second, pair.first)):
                other = ctx.facts.tensor(other_name)
                if other is not None and other.memory_format is not MemoryFormat.STRIDED:
                    deliberate.add(name)
    return deliberate


@rule(
    "ML201",
    "non-contiguous",
    Severity.WARNING,
    "a parameter or buffer is neither contiguous nor channels_last-contiguous",
    "store it contiguous (`p.data = p.data.contiguous()`), or run `memlayout flatten`",
    """
The tensor is transposed, sliced or permuted in memory. Most kernels need a dense
layout and copy it on every call; safetensors refuses to save it ("You are trying
to save a non contiguous tensor"). channels_last conv weights are dense by design
and not reported, nor is a transposed view that ties to a dense tensor.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "A parameter or buffer whose strides are neither contiguous nor channels_last-contiguous: "
        "transposed, permuted, or sliced with a step. A transposed view that ties to a dense tensor "
        "is not reported."
    ),
    example=RuleExample(
        setup="""
import torch

weight = torch.randn(64, 32)
torch.save({"proj.weight": weight.t()}, "model.pt")
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"proj.weight": weight.t().contiguous()}, "model.pt")
""",
    ),
)
def non_contiguous(ctx: RuleContext) -> Iterator[Finding]:
    deliberate: set[str] | None = None
    sharing: frozenset[str] = frozenset()
    hint = ""
    for tensor in ctx.facts.model_tensors():
        if tensor.memory_format is MemoryFormat.STRIDED and not tensor.self_overlapping and tensor.numel > 1:
            if deliberate is None:
                # All once, at the first candidate: the hint depends only on the source.
                deliberate = _views_equal_to_a_dense_view(ctx)
                sharing = _views_of_other_tensors(ctx)
                hint = f"store it contiguous (`p.data = p.data.contiguous()`), or {flatten_hint(ctx.facts.source)}"
            if tensor.name in deliberate:
                continue
            yield non_contiguous.finding(
                (tensor.name,),
                f"{tensor.name} (shape {list(tensor.shape)}, stride {list(tensor.stride)}) is not contiguous",
                storage=tensor.storage,
                hint=_KEPT_VIEW_CONTIGUOUS if tensor.name in sharing else hint,
            )


_KEPT_VIEW_CONTIGUOUS = (
    "store it contiguous (`p.data = p.data.contiguous()`, a copy of its own); flatten keeps a view of another "
    "tensor's bytes a view, strides included, so it cannot"
)


def _views_of_other_tensors(ctx: RuleContext) -> frozenset[str]:
    # flatten keeps sharing: a tensor whose bytes another tensor also views stays a
    # view of them, with its strides and offset, in OUT (followed on the corpus's
    # views.pt and the legacy fixture, ML201 and ML203 stayed after flatten).
    return frozenset(name for group in ctx.facts.alias_groups for name in group.tensors)


def _conv_format(tensor: TensorFact) -> MemoryFormat | None:
    # 1x1 kernels are both contiguous and channels_last; they tell nothing.
    if len(tensor.shape) != 4 or not tensor.is_floating or tensor.shape[2] * tensor.shape[3] == 1:
        return None
    if tensor.memory_format in (MemoryFormat.CONTIGUOUS, MemoryFormat.CHANNELS_LAST):
        return tensor.memory_format
    return None


@rule(
    "ML202",
    "mixed-memory-format",
    Severity.INFO,
    "some 4-D conv weights are channels_last and others are not",
    "convert the whole model once: `model.to(memory_format=torch.channels_last)`",
    """
A model runs fastest when every conv uses one memory format. With a mix, each
boundary between formats costs a layout conversion of the activations.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "4-D convolution weights of one model in more than one memory format: some channels_last, "
        "others contiguous. 1x1 kernels, which are both, are not counted."
    ),
    example=RuleExample(
        setup="""
import torch
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3))
model[0].to(memory_format=torch.channels_last)
torch.save(model.state_dict(), "model.pt")
""",
        command="memlayout inspect model.pt --select ML202",
        fixed="""
model.to(memory_format=torch.channels_last)
torch.save(model.state_dict(), "model.pt")
""",
    ),
)
def mixed_memory_format(ctx: RuleContext) -> Iterator[Finding]:
    formats: dict[MemoryFormat, list[str]] = defaultdict(list)
    for tensor in ctx.facts.model_tensors():
        fmt = _conv_format(tensor)
        if fmt is not None:
            formats[fmt].append(tensor.name)
    if len(formats) < 2:
        return
    minority = min(formats.values(), key=len)
    counts = ", ".join(f"{len(names)} {fmt.value}" for fmt, names in formats.items())
    yield mixed_memory_format.finding(minority, f"4-D conv weights mix memory formats ({counts})")


@rule(
    "ML203",
    "misaligned",
    Severity.INFO,
    "a tensor's data starts off the boundary its format gives (16 bytes; its element size in safetensors), "
    "or off the project's `alignment`",
    "run `memlayout flatten` (slots start on --align bytes, 64 by default), or `.clone()` the tensor",
    """
Vectorized loads, TorchInductor's generated kernels and apex's multi-tensor
kernels need 16-byte-aligned data; a misaligned tensor takes a slow path or a
copy. Where torch uses a file's bytes in place (a torch.save zip under
`torch.load(mmap=True)`, a safetensors file), the offset inside the file is the
alignment the tensor gets. Where torch's loader copies each storage into fresh
memory (legacy torch.save files, TorchScript, torch.export), the allocator
aligns the storage and only the tensor's offset inside it counts. Tensors under
16 bytes are ignored.

Each format is judged by what its own writer gives: torch.save starts every
record on 64 bytes, so a tensor off 16 there sits at an offset inside its
storage. safetensors stores tensors back to back, the data section on 8 bytes
and the largest elements first, so its standard is each tensor on a multiple of
its element size, which `safe_open` needs to hand out a tensor it can use in
place; a file whose header length breaks it (an odd header) makes every tensor
misaligned. 16 or 64 bytes there (mmap, DMA) is a choice: `alignment = 64` in
`[tool.memlayout]` (or `flatten --align 64`) asks every tensor for it.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "A tensor of 16 bytes or more whose first byte is not on a 16-byte boundary: of its storage, "
        "or of the file where torch uses the file's bytes in place (a torch.save zip under "
        "`mmap=True`). In a safetensors file, a tensor whose file offset is no multiple of its element "
        "size (up to 8, the data section's own alignment). With `alignment` set, every tensor of 16 "
        "bytes or more off that boundary, in every format."
    ),
    example=RuleExample(
        setup="""
import torch

data = torch.randn(1001)
torch.save({"weight": data[1:]}, "model.pt")  # starts 4 bytes into its storage
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"weight": data[1:].clone()}, "model.pt")
""",
    ),
)
def misaligned(ctx: RuleContext) -> Iterator[Finding]:
    asked = ctx.config.alignment
    source = ctx.facts.source
    back_to_back = stores_back_to_back(source)
    # A format without gaps is judged, by default, by the element alignment its own writer gives.
    by_element = asked is None and back_to_back
    boundary = asked or ALIGNMENT
    in_file = file_alignment(source)
    found: list[TensorFact] = []
    for tensor in ctx.facts.tensors:
        if tensor.nbytes < ALIGNMENT:
            continue
        inner = tensor.offset * tensor.itemsize
        if tensor.data_address is None:
            # No base address: the storage is fresh memory, aligned by torch's allocator
            # (64 bytes on CPU, 256 on CUDA): only the offset inside it counts.
            off = inner % boundary
        elif back_to_back:
            # A rewrite can start the data section anywhere, so the whole file offset counts.
            off = tensor.data_address % (min(tensor.itemsize, in_file or tensor.itemsize) if by_element else boundary)
        else:
            # The file's bytes used in place: a record starts where the format's own writer
            # puts it (64 bytes for torch.save), and no rewrite in that format does better.
            base = tensor.data_address - inner
            off = inner % boundary or base % min(boundary, in_file or boundary)
        if off:
            found.append(tensor)
    # One finding per file: a safetensors file with an odd header would otherwise give one
    # line per tensor, and in a model folder each weight file is rewritten (and fixed) on its own.
    by_file: dict[str, list[TensorFact]] = defaultdict(list)
    for tensor in found:
        by_file[ctx.facts.storage(tensor.storage).file].append(tensor)
    for tensors in by_file.values():
        yield _misaligned_finding(ctx, tensors, asked, boundary, by_element)


def _misaligned_finding(
    ctx: RuleContext, found: list[TensorFact], asked: int | None, boundary: int, by_element: bool
) -> Finding:
    source = ctx.facts.source
    names = [t.name for t in found]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    storages = {t.storage for t in found}
    views = [name for name in names if name in _views_of_other_tensors(ctx)]
    hint = alignment_hint(source, asked, all(t.nbytes % boundary == 0 for t in ctx.facts.tensors))
    if views:
        hint = (
            f"`.clone()` the tensor (a fresh allocation is aligned); {', '.join(views[:5])} "
            f"{'views' if len(views) == 1 else 'view'} another tensor's bytes, which flatten keeps as a "
            "view at the same offset, so only a copy of its own is aligned"
        )
    plural = len(names) != 1
    if by_element:
        where = (f"a multiple of {'their' if plural else 'its'} element size, where safetensors' own writer puts "
                 "every tensor")
    elif asked is not None:
        where = f"the {asked}-byte boundary the project's alignment asks for"
    else:
        where = f"a {ALIGNMENT}-byte boundary"
    return misaligned.finding(
        names,
        f"{len(names)} tensor{'s' if plural else ''} ({shown}) {'do' if plural else 'does'} not start on {where}",
        storage=next(iter(storages)) if len(storages) == 1 else None,
        hint=hint,
    )


@rule(
    "ML204",
    "fragmented",
    Severity.INFO,
    "parameters spread over many storages that `memlayout flatten` would merge",
    "run `memlayout flatten` to get one buffer per device, dtype and requires_grad",
    """
Each storage is a separate allocation, a separate record on disk and a separate
kernel launch for per-tensor optimizers, grad-norm and all-reduce. Flat buffers
let one fused op cover a whole group. Reported from --fragmented-min-storages
(4 by default) when flattening would reduce the count. RNN modules get a buffer
each, as cuDNN requires. A model directory is flattened file by file, so each
shard keeps its own tensors and the index stays true: the count is per file, and
a safetensors file, one data section, stays one storage.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "Model tensors spread over `fragmented-min-storages` (4) storages or more when `memlayout "
        "flatten` would use fewer: one buffer per device, dtype and requires_grad, and one per RNN "
        "module, in each weight file of a model directory."
    ),
    example=RuleExample(
        setup="""
import torch
from torch import nn

model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
torch.save(model.state_dict(), "model.pt")
""",
        command="memlayout inspect model.pt",
        fixed="""
import memlayout

memlayout.flatten(model)  # one buffer for all eight parameters
torch.save(model.state_dict(), "model.pt")
""",
    ),
)
def fragmented(ctx: RuleContext) -> Iterator[Finding]:
    tensors = [t for t in ctx.facts.model_tensors() if t.has_data and t.numel > 0]
    before = len({t.storage for t in tensors})
    rnn_weights = {name for m in ctx.facts.modules if m.rnn for name in m.rnn.flat_weight_names}
    grouped = [t for t in tensors if not rnn_weights or rnn_weights.isdisjoint(t.names)]
    after = storages_after_flatten(ctx.facts, grouped) + sum(1 for m in ctx.facts.modules if m.rnn)
    if before >= ctx.config.fragmented_min_storages and before > after:
        yield fragmented.finding(
            [],
            f"{len(tensors)} model tensors spread over {before} storages; flatten would use {after}",
            hint=f"{flatten_hint(ctx.facts.source)} to get {flat_layout_phrase(ctx.facts)}",
        )


