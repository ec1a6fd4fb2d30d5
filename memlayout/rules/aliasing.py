"""ML1xx: memory shared when it should not be, or not shared when it should."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator

from memlayout.core.content import ContentReader
from memlayout.core.facts import TensorFact, where_apart
from memlayout.core.strides import Relation
from memlayout.format_bytes import human_bytes
from memlayout.load.hf_ties import FROM_PRETRAINED_WITH_DIFFERENT_VALUES, is_config_tie
from memlayout.rules.registry import Finding, Requirement, RuleContext, RuleExample, rule
from memlayout.severity import Severity


@rule(
    "ML101",
    "partial-overlap",
    Severity.ERROR,
    "two tensors overlap in one storage without being the same view",
    "give each tensor its own memory (`.clone()`), or make them the same view if they are meant to be one",
    """
An in-place update of one tensor (an optimizer step, `add_`, `copy_`) silently
changes part of the other, so two parameters train each other's weights, and
safetensors refuses to save them ("Some tensors share memory").
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "Two views of one storage whose bytes intersect while each also has bytes the other lacks. "
        "The bytes of each view are computed exactly from its shape, stride and offset, so views of "
        "the same bytes (a tie, a transposed tie) and a view inside a bigger one (a slot of a flat "
        "buffer) are not reported."
    ),
    example=RuleExample(
        setup="""
import torch

buffer = torch.zeros(100)
torch.save({"a": buffer[0:60], "b": buffer[40:100]}, "model.pt")
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"a": buffer[0:60].clone(), "b": buffer[40:100].clone()}, "model.pt")
""",
    ),
)
def partial_overlap(ctx: RuleContext) -> Iterator[Finding]:
    for group in ctx.facts.alias_groups:
        for pair in group.pairs:
            if pair.relation is Relation.PARTIAL:
                yield partial_overlap.finding(
                    (pair.first, pair.second),
                    f"{pair.first} and {pair.second} overlap partially in storage {group.storage}",
                    storage=group.storage,
                )


def _share_memory(a: TensorFact, b: TensorFact, overlapping: set[frozenset[str]]) -> bool:
    return a.storage == b.storage and frozenset((a.name, b.name)) in overlapping


def _optimizer_state_hint(ctx: RuleContext) -> str:
    # Name the checkpoint's own model section when there is exactly one, so that the
    # hint is a line to run: resemblyzer keeps its weights under "model_state".
    sections = {t.section for t in ctx.facts.model_tensors()}
    model = (f'checkpoint["{next(iter(sections))}"]' if len(sections) == 1 and "" not in sections
             else "the model's state_dict")
    return (
        "do not tie optimizer state; for a checkpoint meant for inference, save only the model's weights "
        f"(`torch.save({model}, path)`), which drops the optimizer's copies"
    )


@rule(
    "ML102",
    "duplicate-weights",
    Severity.WARNING,
    "tensors with equal dtype, shape and contents live in separate memory",
    "tie them if they should be one (`b.weight = a.weight`, `model.tie_weights()`); otherwise drop the copy",
    """
Two or more tensors are bitwise equal but do not share memory. Usually a tie was
lost: `load_state_dict` into an untied model, `clone()`, meta-device init with
`to_empty()`, or `load_state_dict(assign=True)`. Otherwise it is wasted memory and
disk. Constant tensors (freshly initialized norms and zero biases) and tensors
under --min-duplicate-bytes are ignored. Without --deep, the CRC-32s a torch.save
zip records for its storages settle most candidates without reading a byte; the
rest are told apart by a few sampled elements, and tensors whose samples match are
compared in full. --deep compares contents whatever the recorded CRCs say.

Optimizer state gets its own judgment, at info severity. Equal moments (Adam's
`exp_avg`, `exp_avg_sq`) follow from equal gradients, and some parameters get
equal gradients by construction: an LSTM adds `bias_ih` and `bias_hh` into the
same gates, so their moments stay bitwise equal for the whole run. Tying them
would be wrong; the copy costs only disk, and a checkpoint meant for inference
needs no optimizer state at all.
""",
    needs=(Requirement.LAYOUT, Requirement.CONTENT),
    detects=(
        "Two or more tensors of the same dtype and shape, with bitwise-equal contents, in separate "
        "memory. Constant tensors (a fresh norm's ones, zero biases) and tensors under "
        "`min-duplicate-bytes` (4096 bytes by default) are left out."
    ),
    example=RuleExample(
        setup="""
import torch

embed = torch.randn(1000, 64)
torch.save({"embed.weight": embed, "head.weight": embed.clone()}, "model.pt")
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"embed.weight": embed, "head.weight": embed}, "model.pt")  # tied: one storage
""",
    ),
)
def duplicate_weights(ctx: RuleContext) -> Iterator[Finding]:
    content = ctx.content
    if content is None:
        return
    buckets: dict[tuple[str, tuple[int, ...]], list[TensorFact]] = defaultdict(list)
    for tensor in ctx.facts.tensors:
        if tensor.has_data and tensor.nbytes >= ctx.config.min_duplicate_bytes and not tensor.self_overlapping:
            buckets[(tensor.dtype, tensor.shape)].append(tensor)
    candidates = [group for group in buckets.values() if len(group) > 1]
    if not candidates:
        return
    overlapping = {
        frozenset((pair.first, pair.second)) for group in ctx.facts.alias_groups for pair in group.pairs
    }
    # Each stage only splits groups, and tensors in different groups provably differ,
    # so no stage loses a duplicate. One 64-byte probe and 16 sampled elements settle
    # nearly every candidate of a trained model; what agrees on both is compared in
    # full, streamed chunk by chunk. A fingerprint pass first splits groups of three
    # or more, so that many look-alikes cost one read each, not one per pair. --deep
    # changes nothing here: sampling never hides a duplicate, it only skips reads.
    if not ctx.config.deep:
        # The zip directory's CRC-32s settle whole-storage candidates without a read.
        # --deep skips this stage: it promises a full-content answer, and a damaged
        # CRC could otherwise hide a duplicate.
        candidates = [split for group in candidates for split in _split_by_checksum(content, group) if len(split) > 1]
    for stage in (content.probe, content.sample):
        candidates = [split for group in candidates for split in _split(group, stage) if len(split) > 1]
    candidates = [
        split
        for group in candidates
        for split in (_split(group, content.fingerprint) if len(group) > 2 else [group])
        if len(split) > 1
    ]
    optimizer_hint: str | None = None
    for group in candidates:
        for same in _equal_classes(content, group):
            # Keep one representative per memory region: views that share bytes are
            # ties. Only views of one storage can share bytes, so each tensor is
            # checked against the kept ones of its own storage (an upcycled MoE layer
            # holds 64 equal experts, one storage each).
            distinct: list[TensorFact] = []
            kept_in: dict[str, list[TensorFact]] = defaultdict(list)
            for tensor in same:
                kept = kept_in[tensor.storage]
                if not any(_share_memory(tensor, other, overlapping) for other in kept):
                    distinct.append(tensor)
                    kept.append(tensor)
            if len(distinct) < 2 or content.constant(distinct[0]):
                continue
            wasted = (len(distinct) - 1) * distinct[0].nbytes
            names = [t.name for t in distinct]
            what = f"{distinct[0].dtype}{list(distinct[0].shape)}"
            if all(t.optimizer_state for t in distinct):
                if optimizer_hint is None:  # one pass over the model's tensors, not one per finding
                    optimizer_hint = _optimizer_state_hint(ctx)
                yield duplicate_weights.finding(
                    names,
                    f"optimizer state {', '.join(names)} holds identical {what} contents in separate memory "
                    f"({human_bytes(wasted)} duplicated): equal moments come from equal gradients, as an "
                    "LSTM's bias_ih and bias_hh get by construction, not from a lost tie",
                    wasted_bytes=wasted,
                    severity=Severity.INFO,
                    hint=optimizer_hint,
                )
                continue
            yield duplicate_weights.finding(
                names,
                f"{', '.join(names)} hold identical {what} contents in separate memory ({human_bytes(wasted)} "
                "duplicated)",
                wasted_bytes=wasted,
            )


def _split_by_checksum(content: ContentReader, group: list[TensorFact]) -> list[list[TensorFact]]:
    by_checksum: dict[int, list[TensorFact]] = defaultdict(list)
    for tensor in group:
        checksum = content.recorded_checksum(tensor)
        if checksum is None:
            # A tensor without a recorded CRC cannot be told apart by one.
            return [group]
        by_checksum[checksum].append(tensor)
    return list(by_checksum.values())


def _split(group: list[TensorFact], key: Callable[[TensorFact], Hashable]) -> list[list[TensorFact]]:
    by_key: dict[Hashable, list[TensorFact]] = defaultdict(list)
    for tensor in group:
        by_key[key(tensor)].append(tensor)
    return list(by_key.values())


def _equal_classes(content: ContentReader, group: list[TensorFact]) -> list[list[TensorFact]]:
    # Equal fingerprints only nominate: confirm byte for byte against each class's
    # first member. True duplicates all join the first class, so this costs one
    # comparison per tensor in the usual case.
    classes: list[list[TensorFact]] = []
    for tensor in group:
        for members in classes:
            if content.equal(members[0], tensor):
                members.append(tensor)
                break
        else:
            classes.append([tensor])
    return [members for members in classes if len(members) > 1]


_RESAVE_TIED_DCP = (
    "re-save from a model that ties them: `dcp.save(model.state_dict(), checkpoint_id=DIR)` writes both names "
    "from its one tensor, with one dtype and shape"
)


def _tie_state(ctx: RuleContext, target: TensorFact, source: TensorFact, declared_by: str) -> str:
    if ctx.content is None or target.shape != source.shape or target.dtype != source.dtype:
        return ""
    if ctx.content.sample(target) != ctx.content.sample(source):
        if is_config_tie(declared_by):
            return f"; their contents differ: {FROM_PRETRAINED_WITH_DIFFERENT_VALUES}"
        return "; their contents differ, so tying them again keeps only one of the two"
    return "; their contents match, so the tie was lost on the way (save/load, clone, to_empty, assign=True)"


@rule(
    "ML103",
    "broken-tie",
    Severity.ERROR,
    "a declared tie (config, model class or --tie) is not one storage view",
    "re-tie after loading (`model.tie_weights()` or `head.weight = embed.weight`) and re-save",
    """
A model declares two tensors to be one (Hugging Face `tie_word_embeddings`, a
model's `_tied_weights_keys`, or `--tie a=b`), but they are separate memory. The
model then trains two copies. When their values differ, the next Hugging Face
load depends on the release: transformers 4 re-ties them silently and keeps one
side's values, losing what the other learned; transformers 5 warns and leaves
them untied.
A tie counts as kept when both names reach the same bytes of one storage, as the
same view or as a transposed view.
A torch.distributed.checkpoint never stores a tie once: dcp.save writes each name
on its own, and dcp.load copies both into a model that ties them. There the tie
holds when both names are stored with the same dtype and shape, which the
metadata records.
""",
    needs=(Requirement.SHARING,),
    detects=(
        "A tie the model declares (Hugging Face's `tie_word_embeddings`, a model's "
        "`_tied_weights_keys`, `--tie TARGET=SOURCE` or `ties` in the configuration) whose two "
        "tensors do not reach the same bytes of one storage; in a torch.distributed.checkpoint, "
        "whose two tensors are stored with different dtypes or shapes. A tied name missing from the "
        "checkpoint is not reported: savers drop tied copies."
    ),
    example=RuleExample(
        setup="""
import torch

torch.save({"embed.weight": torch.randn(1000, 64), "head.weight": torch.randn(1000, 64)}, "model.pt")
""",
        command="memlayout inspect model.pt --tie head.weight=embed.weight",
        fixed="""
embed = torch.randn(1000, 64)
torch.save({"embed.weight": embed, "head.weight": embed}, "model.pt")
""",
    ),
)
def broken_tie(ctx: RuleContext) -> Iterator[Finding]:
    declared = [(tie.target, tie.source, tie.declared_by) for tie in ctx.facts.declared_ties]
    declared += [(target, source, "--tie") for target, source in ctx.config.ties]
    # How each pair of views that share bytes relate, built once: a model that ties
    # its decoder to its encoder declares a tie per weight.
    relations = {frozenset((p.first, p.second)): p.relation for g in ctx.facts.alias_groups for p in g.pairs}
    seen: set[frozenset[str]] = set()
    for target_name, source_name, declared_by in declared:
        target, source = ctx.facts.tensor(target_name), ctx.facts.tensor(source_name)
        # A saver may drop the tied copy (safetensors, HF): nothing to compare then.
        if target is None or source is None or target is source:
            continue
        key = frozenset((target.name, source.name))
        if key in seen or (target.storage == source.storage and relations.get(key) is Relation.EQUAL):
            continue
        if ctx.facts.source.chunks:
            # Stored in pieces (DCP): two copies are how a tie is stored; only a
            # dtype or a shape that differs breaks it.
            if (target.dtype, target.shape) == (source.dtype, source.shape):
                continue
            seen.add(key)
            yield broken_tie.finding(
                (target_name, source_name),
                f"{target_name} is declared tied to {source_name} ({declared_by}) but the checkpoint stores "
                f"them as {target.dtype} {list(target.shape)} and {source.dtype} {list(source.shape)}: dcp.load "
                "into a model that ties them cannot give its one tensor both",
                hint=_RESAVE_TIED_DCP,
            )
            continue
        seen.add(key)
        yield broken_tie.finding(
            (target_name, source_name),
            f"{target_name} is declared tied to {source_name} ({declared_by}) but they are separate "
            f"memory ({where_apart(target, source)}){_tie_state(ctx, target, source, declared_by)}",
        )


@rule(
    "ML104",
    "aliased-not-tied",
    Severity.WARNING,
    "distinct Parameter objects view the same memory",
    "make them one Parameter (`b.weight = a.weight`) so that parameters() yields it once",
    """
Two different `nn.Parameter` objects share memory, as after
`load_state_dict(assign=True)` on a tied model. `model.parameters()` yields both,
so an optimizer updates the same memory twice per step (and keeps two sets of
moments), and parameter counts double.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "Distinct `nn.Parameter` objects, in a live module or a pickled one, that view the same "
        "memory."
    ),
    example=RuleExample(
        setup="""
import torch
from torch import nn

model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 100, bias=False))
model[1].weight = nn.Parameter(model[0].weight.data)  # a second Parameter on the same memory
torch.save(model, "model.pt")
""",
        command="memlayout inspect model.pt --select ML104",
        fixed="""
model[1].weight = model[0].weight  # one Parameter under two names
torch.save(model, "model.pt")
""",
    ),
)
def aliased_not_tied(ctx: RuleContext) -> Iterator[Finding]:
    for tensor in ctx.facts.tensors:
        if len(tensor.parameter_ids) > 1:
            yield aliased_not_tied.finding(
                tensor.names,
                f"{len(tensor.parameter_ids)} distinct Parameter objects ({', '.join(tensor.names)}) "
                f"view the same memory in storage {tensor.storage}",
                storage=tensor.storage,
            )
    for group in ctx.facts.alias_groups:
        for pair in group.pairs:
            first, second = ctx.facts.tensor(pair.first), ctx.facts.tensor(pair.second)
            if first is None or second is None or pair.relation is Relation.PARTIAL:
                continue
            if first.parameter_ids and second.parameter_ids and set(first.parameter_ids).isdisjoint(
                second.parameter_ids
            ):
                yield aliased_not_tied.finding(
                    (first.name, second.name),
                    f"Parameters {first.name} and {second.name} are distinct objects viewing "
                    f"the same memory in storage {group.storage} ({pair.relation.value})",
                    storage=group.storage,
                )


@rule(
    "ML105",
    "self-overlap",
    Severity.ERROR,
    "a tensor's elements alias each other (zero stride from expand, or internal overlap)",
    "materialize it with `.contiguous()` (or `.clone()`) before registering or saving it",
    """
Different indices of one tensor address the same memory, as after `expand()` or
`as_strided` with overlapping strides. In-place updates are then undefined (torch
refuses many of them), every kernel that needs real memory copies it, and a
gradient step applies several updates to one element.
""",
    needs=(Requirement.LAYOUT,),
    detects=(
        "A tensor in which different indices address the same element: a zero stride (from `expand`) "
        "or strides that make rows overlap."
    ),
    example=RuleExample(
        setup="""
import torch

torch.save({"bias": torch.zeros(1, 64).expand(32, 64)}, "model.pt")
""",
        command="memlayout inspect model.pt",
        fixed="""
torch.save({"bias": torch.zeros(1, 64).expand(32, 64).contiguous()}, "model.pt")
""",
    ),
)
def self_overlap(ctx: RuleContext) -> Iterator[Finding]:
    for tensor in ctx.facts.tensors:
        if tensor.self_overlapping:
            yield self_overlap.finding(
                (tensor.name,),
                f"{tensor.name} (shape {list(tensor.shape)}, stride {list(tensor.stride)}) has elements "
                "that alias each other",
                storage=tensor.storage,
            )
