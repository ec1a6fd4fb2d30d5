"""Layout facts: immutable descriptions of tensors, storages and their aliasing.

Facts are derived from loader records once and never change. Rules read them;
reporters render them. Nothing here renders, prints or touches torch.

`TensorFact` and `StorageFact`, one per tensor and per storage, are NamedTuples for
the reason the loader records are (see memlayout.load.records): as immutable and
typed as a frozen dataclass, built several times faster and in less memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from memlayout.core.cudnn_layout import (
    INFERRED_RNN_LABEL,
    WEIGHT_KINDS,
    WEIGHT_NAME,
    geometry_from_shapes,
    layout_of,
    local_name,
    rnn_layout_problem,
    unused_bias_numel,
)
from memlayout.core.strides import (
    ByteSet,
    MemoryFormat,
    Relation,
    byte_set,
    contiguous_byte_set,
    has_internal_overlap,
    is_contiguous,
    memory_format,
    numel,
    relation,
    union,
)
from memlayout.dtypes import DtypeInfo, dtype_info
from memlayout.load.records import (
    DeclaredTie,
    LoadedSource,
    ModuleRecord,
    PickleGlobal,
    RankRecord,
    RnnRecord,
    ShardRecord,
    StorageRecord,
    TensorKind,
    TensorRecord,
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


def infer_rnn_modules(tensors: Mapping[str, TensorFact]) -> list[ModuleRecord]:
    """RNN modules recognized from state-dict names and shapes, for sources without a module tree.

    The names follow `RNNBase._flat_weights_names`: per layer and direction,
    weight_ih, weight_hh, bias_ih, bias_hh, weight_hr. A `_raw` copy stands for a
    weight that is not a registered Parameter (the weight-dropout pattern); awd-lstm
    registers it on the RNN itself, fastai's WeightDropout on the wrapper above it.
    The mode comes from the gate multiple of the shapes (LSTM 4, GRU 3, RNN 1; an
    RNN's tanh or relu cannot be told from its weights), and names whose shapes
    form no torch RNN are not taken for one.
    """
    weights: dict[str, dict[tuple[int, int, int], str]] = defaultdict(dict)
    raw: dict[str, dict[tuple[int, int, int], str]] = defaultdict(dict)
    for name in tensors:
        # Every RNN weight name has "_l<layer>"; the substring test spares the regex
        # for the hundreds of other names of a model.
        if "_l" not in name:
            continue
        match = WEIGHT_NAME.match(name)
        if not match:
            continue
        key = (int(match["layer"]), 1 if match["reverse"] else 0, WEIGHT_KINDS.index(match["kind"]))
        if match["raw"]:
            raw[match["prefix"]][key] = name
        else:
            weights[match["prefix"]][key] = name
    modules = []
    for prefix, found in weights.items():
        if not any(k[2] == 0 for k in found):
            continue
        shadowed = {
            k: raw_name for holder, keys in raw.items() if prefix.startswith(holder)
            for k, raw_name in keys.items() if k not in found
        }
        names_by_key = dict(found)
        shapes = {local_name(name): tensors[name].shape for name in found.values()}
        for (layer, reverse, kind), raw_name in shadowed.items():
            name = f"{prefix}{WEIGHT_KINDS[kind]}_l{layer}{'_reverse' if reverse else ''}"
            names_by_key[(layer, reverse, kind)] = name
            shapes[local_name(name)] = tensors[raw_name].shape
        geometry = geometry_from_shapes(None, shapes)
        if isinstance(geometry, str):
            continue
        ordered = tuple(names_by_key[k] for k in sorted(names_by_key))
        unregistered = tuple(names_by_key[k] for k in sorted(shadowed))
        label = INFERRED_RNN_LABEL if geometry.mode == "RNN" else geometry.mode
        modules.append(
            ModuleRecord(
                prefix.rstrip("."), f"(inferred from names) {label}", RnnRecord(geometry.mode, ordered, unregistered)
            )
        )
    return modules


def _merge_kind(kinds: Iterable[TensorKind]) -> TensorKind:
    kinds = set(kinds)
    for kind in (TensorKind.PARAMETER, TensorKind.BUFFER):
        if kind in kinds:
            return kind
    return TensorKind.TENSOR


class _Geometry:
    """What a (shape, stride) pair implies, whatever the offset: computed once per distinct pair.

    A model repeats a handful of shapes hundreds of times (every block of a
    transformer has the same projections), so facts look each pair up here instead
    of re-deriving contiguity and memory format per tensor.
    """

    def __init__(self) -> None:
        self.known: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, bool, MemoryFormat, bool]] = {}
        self.runs: dict[tuple[int, int, int], ByteSet] = {}
        self.strided: dict[tuple[tuple[int, ...], tuple[int, ...], int, int], ByteSet] = {}

    def of(self, shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, bool, MemoryFormat, bool]:
        """(numel, contiguous, memory format, self-overlapping)."""
        key = (shape, stride)
        known = self.known.get(key)
        if known is None:
            contiguous = is_contiguous(shape, stride)
            if contiguous:
                known = (numel(shape), True, MemoryFormat.CONTIGUOUS, False)
            else:
                known = (numel(shape), False, memory_format(shape, stride), has_internal_overlap(shape, stride))
            self.known[key] = known
        return known

    def strided_bytes(self, shape: tuple[int, ...], stride: tuple[int, ...], offset: int, itemsize: int) -> ByteSet:
        """The bytes a strided view covers; equal views of equal storages share one (immutable) ByteSet.

        40,000 transposed weights of a few shapes are a few byte sets, not 40,000
        enumerations of runs.
        """
        key = (shape, stride, offset, itemsize)
        found = self.strided.get(key)
        if found is None:
            found = self.strided[key] = byte_set(shape, stride, offset, itemsize)
        return found

    def contiguous_bytes(self, offset: int, count: int, itemsize: int) -> ByteSet:
        """The one run a contiguous view covers; equal runs share one (immutable) ByteSet."""
        key = (offset, count, itemsize)
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = contiguous_byte_set(offset, count, itemsize)
        return run


def _tensor_fact(
    records: Sequence[TensorRecord], storage: StorageRecord, storage_id: str, dtype: DtypeInfo, geometry: _Geometry
) -> TensorFact:
    first = records[0]
    shape, stride, offset, itemsize = first.shape, first.stride, first.offset, dtype.itemsize
    count, contiguous, fmt, overlapping = geometry.of(shape, stride)
    base = storage.base_address
    if contiguous:
        # Nearly every tensor of a checkpoint: one run of bytes, and none of the
        # strided geometry (or its numpy import) is needed.
        used = geometry.contiguous_bytes(offset, count, itemsize)
    else:
        used = geometry.strided_bytes(shape, stride, offset, itemsize)
    if len(records) == 1:
        # The common untied tensor: skip the merging of names, kinds and identities.
        names: tuple[str, ...] = (first.name,)
        kind = first.kind
        requires_grad = first.requires_grad
        parameter_ids: tuple[int, ...] = (
            (first.object_id,) if kind is TensorKind.PARAMETER and first.object_id is not None else ()
        )
        optimizer_state = first.optimizer_state
    else:
        names = tuple(dict.fromkeys(r.name for r in records))
        kind = _merge_kind(r.kind for r in records)
        requires_grad = any(r.requires_grad for r in records)
        parameter_ids = tuple(
            dict.fromkeys(
                r.object_id for r in records if r.kind is TensorKind.PARAMETER and r.object_id is not None
            )
        )
        optimizer_state = all(r.optimizer_state for r in records)
    # Positional, in TensorFact's field order (keywords would cost more than the build).
    return TensorFact(
        first.name, names, kind, dtype.name, itemsize, storage.device, shape, stride, storage_id, offset,
        count, count * itemsize, contiguous, fmt, used, overlapping,
        None if base is None else base + offset * itemsize,
        requires_grad, parameter_ids, optimizer_state, first.section, first.pinned, first.shared_memory,
        storage.has_data,
    )


def unused_ranges(
    used: tuple[tuple[int, int], ...], nbytes: int, reserved: tuple[int, int] | None = None
) -> list[tuple[int, int, bool]]:
    """Every byte range of a storage no tensor uses, as (start, end, is padding).

    Padding is told from bloat by the alignment the slots show (see
    MIN_PADDING_ALIGNMENT), and by flatten's rounding of a buffer's end (see
    FLAT_BUFFER_ALIGNMENT); bytes inside `reserved` (an RNN's bias space in
    cuDNN's layout, see `rnn_reserved_bytes`) are padding whatever their size.

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


def _split_unused(
    used: tuple[tuple[int, int], ...], nbytes: int, reserved: tuple[int, int] | None = None
) -> tuple[int, int]:
    """(padding, unused) bytes of a storage given its used ranges; bytes of `reserved` are padding."""
    if len(used) == 1 and used[0][0] == 0 and used[0][1] >= nbytes:
        return 0, 0  # one tensor filling its storage, the usual case: nothing unused
    padding = unused = 0
    for start, end, is_padding in unused_ranges(used, nbytes, reserved):
        if is_padding:
            padding += end - start
        else:
            unused += end - start
    return padding, unused


def _alias_groups(storage_id: str, views: list[TensorFact]) -> AliasGroup | None:
    # Sweep views by first byte; only views whose spans meet can share bytes,
    # so a flat buffer (or a safetensors file's data section) with 100,000 disjoint
    # slots costs O(n log n): a slot that starts past the end of every earlier one
    # meets none of them and is taken without a comparison.
    ordered = sorted(
        (byte_set.start, -byte_set.end, index)
        for index, view in enumerate(views)
        if (byte_set := view.bytes_used).intervals
    )
    pairs: list[AliasPair] = []
    active: list[TensorFact] = []
    reach = -1
    for start, negative_end, index in ordered:
        view = views[index]
        if start >= reach:
            active = [view]
            reach = -negative_end
            continue
        active = [a for a in active if a.bytes_used.end > start]
        for earlier in active:
            rel = relation(earlier.bytes_used, view.bytes_used)
            if rel is not Relation.DISJOINT:
                pairs.append(AliasPair(earlier.name, view.name, rel))
        active.append(view)
        reach = max(reach, -negative_end)
    if not pairs:
        return None
    members = list(dict.fromkeys(name for p in pairs for name in (p.first, p.second)))
    return AliasGroup(storage_id, tuple(members), tuple(pairs))


def build_facts(source: LoadedSource) -> Facts:
    """Derive layout facts from what a loader found.

    Args:
        source: The loader's records.

    Returns:
        Immutable `Facts`: one `TensorFact` per distinct view (names merged), one
        `StorageFact` per storage, and alias groups of views sharing bytes.
    """
    # Everything below runs once per tensor of checkpoints of up to 100,000
    # tensors, so the common case (one name per view, one view per storage) takes
    # a straight path with no per-tensor function call.
    records_of_view: Iterable[Sequence[TensorRecord]]
    views_of_storage: dict[str, int] = {}
    dtypes: dict[str, DtypeInfo] = {}  # "torch.float32" and "float32" are one dtype
    if len({record.storage_key for record in source.tensors}) == len(source.tensors):
        # Every tensor has a storage of its own (a state dict's usual shape): each
        # record is a view of its own, and grouping them would find nothing.
        records_of_view = [(record,) for record in source.tensors]
    else:
        by_view: dict[tuple[object, ...], list[TensorRecord]] = {}
        for record in source.tensors:
            info = dtypes.get(record.dtype)
            if info is None:
                info = dtypes[record.dtype] = dtype_info(record.dtype)
            key = record.storage_key
            view = (key, record.offset, record.shape, record.stride, info.name)
            same_view = by_view.get(view)
            if same_view is None:
                by_view[view] = [record]
                views_of_storage[key] = views_of_storage.get(key, 0) + 1
            else:
                same_view.append(record)
        records_of_view = by_view.values()

    storage_ids: dict[str, str] = {}
    records_of_storage = source.storages
    geometry = _Geometry()
    geometry_of, runs = geometry.known.get, geometry.runs
    parameter = TensorKind.PARAMETER
    # A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the
    # same fact from a tuple of its fields in compiled code, in half the time.
    new_fact = tuple.__new__
    tensors_list: list[TensorFact] = []
    by_name: dict[str, TensorFact] = {}
    # Storages in order of first use; a storage with several views gets its fact
    # once all of them are known, in the slot it was given.
    storages: list[StorageFact | None] = []
    shared_storages: dict[str, tuple[int, list[TensorFact]]] = {}
    for records in records_of_view:
        first = records[0]
        key = first.storage_key
        storage_record = records_of_storage[key]
        storage_id = storage_ids.get(key)
        if storage_id is None:
            storage_id = storage_ids[key] = f"s{len(storage_ids)}"
            storages.append(None)
            if views_of_storage.get(key, 1) > 1:
                shared_storages[key] = (len(storages) - 1, [])
        dtype = dtypes.get(first.dtype)
        if dtype is None:
            dtype = dtypes[first.dtype] = dtype_info(first.dtype)
        if len(records) == 1:
            # _tensor_fact for one name, inlined.
            shape, stride, offset = first.shape, first.stride, first.offset
            itemsize = dtype.itemsize
            known = geometry_of((shape, stride))
            count, contiguous, fmt, overlapping = known if known is not None else geometry.of(shape, stride)
            if contiguous:
                used_bytes_key = (offset, count, itemsize)
                bytes_used = runs.get(used_bytes_key)
                if bytes_used is None:
                    bytes_used = geometry.contiguous_bytes(offset, count, itemsize)
            else:
                bytes_used = geometry.strided_bytes(shape, stride, offset, itemsize)
            kind = first.kind
            base = storage_record.base_address
            fact = new_fact(TensorFact, (
                first.name, (first.name,), kind, dtype.name, itemsize, storage_record.device, shape, stride,
                storage_id, offset, count, count * itemsize, contiguous, fmt, bytes_used, overlapping,
                None if base is None else base + offset * itemsize, first.requires_grad,
                (first.object_id,) if kind is parameter and first.object_id is not None else (),
                first.optimizer_state, first.section, first.pinned, first.shared_memory, storage_record.has_data,
            ))
            by_name[first.name] = fact
        else:
            fact = _tensor_fact(records, storage_record, storage_id, dtype, geometry)
            for name in fact.names:
                by_name[name] = fact
        tensors_list.append(fact)
        if key in shared_storages:
            shared_storages[key][1].append(fact)
        else:
            used = fact.bytes_used.intervals
            if len(used) == 1:
                start, end = used[0]
                used_bytes = end - start
                # A tensor filling its own storage, the usual case, leaves nothing unused.
                full = start == 0 and end >= storage_record.nbytes
            else:
                used_bytes = sum(end - start for start, end in used)
                full = False
            padding, unused = (0, 0) if full else _split_unused(used, storage_record.nbytes)
            storages[-1] = new_fact(StorageFact, (
                storage_id, key, storage_record.device, storage_record.nbytes, (fact.name,),
                used, used_bytes, padding, unused, storage_record.base_address, storage_record.has_data,
            ))
    tensors = tuple(tensors_list)

    groups = []
    for key, (slot, views) in shared_storages.items():
        storage_record = records_of_storage[key]
        storage_id = storage_ids[key]
        used = union([v.bytes_used for v in views])
        used_bytes = sum(end - start for start, end in used)
        padding, unused = _split_unused(used, storage_record.nbytes)
        storages[slot] = StorageFact(
            storage_id, key, storage_record.device, storage_record.nbytes, tuple(v.name for v in views),
            used, used_bytes, padding, unused, storage_record.base_address, storage_record.has_data,
        )
        group = _alias_groups(storage_id, views)
        if group is not None:
            groups.append(group)
    # Alias groups in storage order, as they were when every storage was visited in order.
    groups.sort(key=lambda group: int(group.storage[1:]))
    storage_facts = tuple(storage for storage in storages if storage is not None)
    assert len(storage_facts) == len(storages)

    facts = Facts(
        source=SourceFact(
            path=source.path,
            format=source.format,
            legacy_format=source.legacy_format,
            pickle_globals=tuple(source.pickle_globals),
            notes=tuple(source.notes),
            layout_unrecorded=source.layout_unrecorded,
            content_unreadable=source.content_unreadable,
            also_valid_as=source.also_valid_as,
        ),
        tensors=tensors,
        storages=storage_facts,
        alias_groups=tuple(groups),
        modules=tuple(source.modules or infer_rnn_modules(by_name)),
        declared_ties=tuple(source.declared_ties),
        shards=tuple(source.shards),
        rank=source.rank,
        world_size=source.world_size,
        _by_name=by_name,
        _by_storage={s.id: s for s in storage_facts},
    )
    if source.shards:
        facts = _with_shard_padding(facts, storage_ids)
    return _with_rnn_bias_space(facts) if facts.modules else facts


def _with_shard_padding(facts: Facts, storage_ids: Mapping[str, str]) -> Facts:
    """Count the rows FSDP2 pads a rank's piece with as padding, not as bytes saving writes for nothing.

    FSDP2 gives every rank a buffer the size of the largest piece and views its own
    piece at the start; the rest is padding that the sharding needs (ML303 reports
    it when it is large), not a slice of a bigger tensor (ML301).
    """
    padded = {storage_ids[s.storage_key] for s in facts.shards if s.padding_bytes and s.storage_key in storage_ids}
    if not padded:
        return facts
    storages = [
        s._replace(padding_bytes=s.padding_bytes + s.unused_bytes, unused_bytes=0) if s.id in padded else s
        for s in facts.storages
    ]
    return replace(facts, storages=tuple(storages), _by_storage={s.id: s for s in storages})


def _with_rnn_bias_space(facts: Facts) -> Facts:
    """Count the bias space of an RNN without biases, in cuDNN's layout, as padding.

    torch describes every RNN to cuDNN with two bias vectors per layer, so cuDNN's
    weight buffer keeps that space (zero) even for `bias=False`, and
    `try_get_weight_buf` refuses a storage without it: those bytes are required,
    not bloat.
    """
    reserved = rnn_reserved_bytes(facts)
    if not reserved:
        return facts
    storages = []
    for storage in facts.storages:
        if storage.id in reserved:
            padding, unused = _split_unused(storage.used, storage.nbytes, reserved[storage.id])
            storage = storage._replace(padding_bytes=padding, unused_bytes=unused)
        storages.append(storage)
    return replace(facts, storages=tuple(storages), _by_storage={s.id: s for s in storages})


def rnn_reserved_bytes(facts: Facts) -> dict[str, tuple[int, int]]:
    """storage id -> the byte range cuDNN keeps for the biases of an RNN without biases."""
    reserved: dict[str, tuple[int, int]] = {}
    for module in facts.modules:
        if module.rnn is None or rnn_layout_problem(facts, module.rnn) is not None:
            continue
        layout = layout_of(facts, module.rnn)
        first = facts.tensor(module.rnn.flat_weight_names[0])
        if isinstance(layout, str) or first is None or not unused_bias_numel(layout):
            continue
        end = layout.numel * first.itemsize
        reserved[first.storage] = (end - unused_bias_numel(layout) * first.itemsize, end)
    return reserved
