"""Layout facts: immutable descriptions of tensors, storages and their aliasing.

Facts are derived from loader records once (by `memlayout.core.fact_builder`) and
never change. Rules read them; reporters render them. Nothing here renders,
prints or touches torch.

`TensorFact` and `StorageFact`, one per tensor and per storage, are NamedTuples for
the reason the loader records are (see memlayout.load.records): as immutable and
typed as a frozen dataclass, built several times faster and in less memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from memlayout.core.strides import ByteSet, MemoryFormat, Relation
from memlayout.dtypes import dtype_info
from memlayout.load.records import (
    ChunkRecord,
    DeclaredTie,
    MemberRecord,
    ModuleRecord,
    PickleGlobal,
    RankRecord,
    ShardRecord,
    TensorKind,
)

# Alignment padding (what flatten, FSDP or Megatron leave between slots) is told
# from bloat by the alignment the slots themselves show: the smallest alignment
# among slot starts after byte 0. A gap shorter than that, ending on such a
# boundary or at the buffer's end, is padding.
MIN_PADDING_ALIGNMENT = 16
MAX_PADDING_ALIGNMENT = 4096
# `memlayout flatten` starts slots on, and rounds each buffer's end up to, this
# many bytes by default. Its tail rounding is told from the layout alone: a storage
# whose size is a multiple of it and whose last used byte is less than it from
# the end holds exactly what flatten writes, even with one slot (a group of one
# tensor) and so no slot start to show the alignment. Without this, diff called
# flatten's own output a wasted-bytes regression (issue 26). A user's slice of a
# tensor whose size is a multiple of 64 bytes, short of it by less than 64 bytes,
# reads the same; flatten calls that layout flat too, and leaves it as it is.
FLAT_BUFFER_ALIGNMENT = 64


class TensorFact(NamedTuple):
    """One distinct view: every name that reaches the same (storage, offset, shape, stride, dtype)."""

    name: str
    """The first name it was found under; the one findings cite."""
    names: tuple[str, ...]
    """Every name it is reachable by; tied parameters have several."""
    kind: TensorKind
    dtype: str
    itemsize: int
    device: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage: str
    """Id of its `StorageFact`."""
    offset: int
    """Storage offset in elements."""
    numel: int
    nbytes: int
    """numel x itemsize: the logical size, whatever the strides."""
    contiguous: bool
    memory_format: MemoryFormat
    bytes_used: ByteSet
    """Exact byte ranges of the storage this view touches."""
    self_overlapping: bool
    data_address: int | None
    """Address of the first element (pointer or file offset); None when unknown."""
    requires_grad: bool
    parameter_ids: tuple[int, ...]
    """Distinct Parameter objects behind this view (more than one is ML104)."""
    optimizer_state: bool
    section: str
    """Top-level checkpoint section ("model", "optimizer"), "" when not nested."""
    pinned: bool | None
    shared_memory: bool | None
    has_data: bool
    """False for meta tensors and metadata-only sources."""

    @property
    def is_floating(self) -> bool:
        return dtype_info(self.dtype).is_floating


class StorageFact(NamedTuple):
    """One storage and how its bytes are used."""

    id: str
    """Short stable id ("s0", "s1", ...) in order of first use."""
    key: str
    """The loader's key (zip record, pointer, file range)."""
    device: str
    nbytes: int
    tensors: tuple[str, ...]
    """Names (first name of each view) of the tensors viewing it."""
    used: tuple[tuple[int, int], ...]
    """Merged byte ranges any tensor touches."""
    used_bytes: int
    padding_bytes: int
    """Unused bytes that are alignment padding between or after slots, or the bias
    space cuDNN's layout keeps in the buffer of an RNN without biases."""
    unused_bytes: int
    """Unused bytes that are not padding: what saving writes for nothing."""
    base_address: int | None
    has_data: bool
    file: str = ""
    """The weight file of a model directory that holds it; "" for a source of one file.
    flatten rewrites each file on its own, so no flat buffer spans two."""


@dataclass(frozen=True)
class AliasPair:
    """Two views of one storage whose bytes meet."""

    first: str
    second: str
    relation: Relation


@dataclass(frozen=True)
class AliasGroup:
    """Views of one storage connected by shared bytes."""

    storage: str
    tensors: tuple[str, ...]
    pairs: tuple[AliasPair, ...]


@dataclass(frozen=True)
class SourceFact:
    """Where the facts came from."""

    path: str | None
    format: str
    legacy_format: bool = False
    pickle_globals: tuple[PickleGlobal, ...] = ()
    notes: tuple[str, ...] = ()
    layout_unrecorded: str = ""
    """Why the storages, strides, offsets and devices are stand-ins, when they are."""
    content_unreadable: str = ""
    """Why the tensors' bytes cannot be read, when they cannot."""
    also_valid_as: tuple[str, ...] = ()
    """Other container formats the file is also valid as (a polyglot)."""
    files: tuple[str, ...] = ()
    """For a directory: the files its loader read, relative to `path`."""
    chunks: tuple[ChunkRecord, ...] = ()
    """The pieces the checkpoint stores each tensor in (DCP); empty for other sources."""
    contents: tuple[MemberRecord, ...] = ()
    """For a compressed stream or an archive: every file inside, and what it was read as."""


@dataclass(frozen=True)
class Facts:
    """Everything known about one model or checkpoint's layout."""

    source: SourceFact
    tensors: tuple[TensorFact, ...]
    storages: tuple[StorageFact, ...]
    alias_groups: tuple[AliasGroup, ...]
    modules: tuple[ModuleRecord, ...]
    declared_ties: tuple[DeclaredTie, ...]
    shards: tuple[ShardRecord, ...] = ()
    """This rank's pieces of tensors spread over ranks (DTensors), one per tensor name."""
    rank: int = 0
    world_size: int = 1
    ranks: tuple[RankRecord, ...] = ()
    """Every rank's pieces and totals, when the ranks shared them (under torchrun); empty otherwise."""
    _by_name: dict[str, TensorFact] = field(repr=False, compare=False, default_factory=dict)
    _by_storage: dict[str, StorageFact] = field(repr=False, compare=False, default_factory=dict)
    _model_tensors: list[TensorFact] | None = field(repr=False, compare=False, default=None)

    def tensor(self, name: str) -> TensorFact | None:
        """The view reachable by `name`, under any of its names."""
        return self._by_name.get(name)

    def storage(self, storage_id: str) -> StorageFact:
        return self._by_storage[storage_id]

    def model_tensors(self) -> list[TensorFact]:
        """Tensors that are the model's own: everything but optimizer state.

        Computed once: several rules ask, and a checkpoint may hold 100,000 tensors.
        """
        found = self._model_tensors
        if found is None:
            found = [t for t in self.tensors if not t.optimizer_state]
            object.__setattr__(self, "_model_tensors", found)
        return list(found)


def alias_groups_with_ties(facts: Facts) -> tuple[AliasGroup, ...]:
    """The alias groups, with each view's own names added as a tie: what a report lists as sharing.

    Facts merge the names of one view (a tie saved as one tensor, `head.weight =
    embed.weight`) into one `TensorFact`, so `alias_groups`, which pairs distinct
    views, never shows that tie; rules need it that way. A reader of a report asks
    which names share memory, and a tie is the commonest answer.

    Args:
        facts: One checkpoint's facts.

    Returns:
        One group per storage, in storage order: its alias pairs, then an `equal`
        pair from each view's first name to each of its other names.
    """
    named = [t for t in facts.tensors if len(t.names) > 1]
    if not named:
        return facts.alias_groups
    groups = {group.storage: group for group in facts.alias_groups}
    for tensor in named:
        group = groups.get(tensor.storage) or AliasGroup(tensor.storage, (), ())
        pairs = tuple(AliasPair(tensor.name, other, Relation.EQUAL) for other in tensor.names[1:])
        members = tuple(dict.fromkeys((*group.tensors, *tensor.names)))
        groups[tensor.storage] = AliasGroup(tensor.storage, members, group.pairs + pairs)
    order = {storage.id: index for index, storage in enumerate(facts.storages)}
    return tuple(sorted(groups.values(), key=lambda group: order[group.storage]))


def where_apart(first: TensorFact, second: TensorFact) -> str:
    """Where two views that should be one memory live, for messages: their storages, or their bytes of one.

    A safetensors file is one storage (its data section), so an untied head and
    embedding of one file sit in the same storage at different bytes; naming the
    storage twice ("storages s0 and s0") would contradict "separate memory".
    """
    if first.storage != second.storage:
        return f"storages {first.storage} and {second.storage}"
    return (
        f"bytes {first.bytes_used.start:,}..{first.bytes_used.end:,} and "
        f"{second.bytes_used.start:,}..{second.bytes_used.end:,} of storage {first.storage}"
    )


def unused_ranges(
    used: tuple[tuple[int, int], ...], nbytes: int, reserved: tuple[int, int] | None = None
) -> list[tuple[int, int, bool]]:
    """Every byte range of a storage no tensor uses, as (start, end, is padding).

    Padding is told from bloat by the alignment the slots show (see
    MIN_PADDING_ALIGNMENT), and by flatten's rounding of a buffer's end (see
    FLAT_BUFFER_ALIGNMENT); bytes inside `reserved` (an RNN's bias space in
    cuDNN's layout, see `memlayout.core.rnn_facts.rnn_reserved_bytes`) are padding whatever their size.

    Args:
        used: The storage's merged used ranges, in order (`StorageFact.used`).
        nbytes: The storage's size.
        reserved: A byte range that is required, not bloat.

    Returns:
        The gaps in order.
    """
    if len(used) == 1 and used[0][0] == 0 and used[0][1] >= nbytes:
        return []  # one tensor filling its storage, the usual case: nothing unused
    starts = [start for start, _ in used if start > 0]
    slot_alignment = min((min(s & -s, MAX_PADDING_ALIGNMENT) for s in starts), default=0)
    tail_alignment = FLAT_BUFFER_ALIGNMENT if nbytes % FLAT_BUFFER_ALIGNMENT == 0 else 0
    gaps: list[tuple[int, int, bool]] = []
    cursor = 0
    for start, end in (*used, (nbytes, nbytes)):
        pieces = [(cursor, start)] if start > cursor else []
        kept = 0
        if pieces and reserved is not None:
            low, high = max(cursor, reserved[0]), min(start, reserved[1])
            if high > low:
                kept = high - low
                pieces = [(a, b) for a, b in ((cursor, low), (high, start)) if b > a]
                gaps.append((low, high, True))
        gap = start - cursor - kept
        if gap > 0:
            on_boundary = start == nbytes or (slot_alignment and start % slot_alignment == 0)
            # A leading gap is never padding: nothing needed aligning before byte 0.
            padding = cursor > 0 and (
                (slot_alignment >= MIN_PADDING_ALIGNMENT and gap < slot_alignment and bool(on_boundary))
                or (start == nbytes and gap < tail_alignment)
            )
            gaps += [(a, b, padding) for a, b in pieces]
        cursor = max(cursor, end)
    return sorted(gaps)

