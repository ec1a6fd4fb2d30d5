"""Building layout facts from a loader's records: `build_facts`.

Runs once per tensor of checkpoints of up to 100,000 tensors, so the per-tensor
path is written for speed (see `build_facts`); the facts it returns are the
immutable types of `memlayout.core.facts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from memlayout.core.facts import (
    AliasGroup,
    AliasPair,
    Facts,
    SourceFact,
    StorageFact,
    TensorFact,
    unused_ranges,
)
from memlayout.core.rnn_facts import infer_rnn_modules, rnn_reserved_bytes
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
from memlayout.load.records import LoadedSource, TensorKind, TensorRecord


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


def _merged_identity(
    records: Sequence[TensorRecord],
) -> tuple[tuple[str, ...], TensorKind, bool, tuple[int, ...], bool]:
    """(names, kind, requires_grad, parameter ids, optimizer state) of a view reached by several records."""
    names = tuple(dict.fromkeys(r.name for r in records))
    kind = _merge_kind(r.kind for r in records)
    requires_grad = any(r.requires_grad for r in records)
    parameter_ids = tuple(
        dict.fromkeys(r.object_id for r in records if r.kind is TensorKind.PARAMETER and r.object_id is not None)
    )
    optimizer_state = all(r.optimizer_state for r in records)
    return names, kind, requires_grad, parameter_ids, optimizer_state


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
    # a straight path: its tensor fact and its storage fact in one step of one loop.
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
        # A tensor's fact, built here rather than in a function: a call per tensor
        # cost 10% of this loop on 40,000 tensors (benchmarks/speed/bench_many_tensors.py).
        shape, stride, offset = first.shape, first.stride, first.offset
        itemsize = dtype.itemsize
        known = geometry_of((shape, stride))
        count, contiguous, fmt, overlapping = known if known is not None else geometry.of(shape, stride)
        if contiguous:
            # Nearly every tensor of a checkpoint: one run of bytes, and none of the
            # strided geometry (or its numpy import) is needed.
            bytes_used = runs.get((offset, count, itemsize))
            if bytes_used is None:
                bytes_used = geometry.contiguous_bytes(offset, count, itemsize)
        else:
            bytes_used = geometry.strided_bytes(shape, stride, offset, itemsize)
        if len(records) == 1:
            # The common untied tensor: nothing to merge.
            names: tuple[str, ...] = (first.name,)
            kind = first.kind
            requires_grad = first.requires_grad
            parameter_ids: tuple[int, ...] = (
                (first.object_id,) if kind is parameter and first.object_id is not None else ()
            )
            optimizer_state = first.optimizer_state
        else:
            names, kind, requires_grad, parameter_ids, optimizer_state = _merged_identity(records)
        base = storage_record.base_address
        fact = new_fact(TensorFact, (
            first.name, names, kind, dtype.name, itemsize, storage_record.device, shape, stride,
            storage_id, offset, count, count * itemsize, contiguous, fmt, bytes_used, overlapping,
            None if base is None else base + offset * itemsize, requires_grad, parameter_ids,
            optimizer_state, first.section, first.pinned, first.shared_memory, storage_record.has_data,
        ))
        for name in names:
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
                storage_record.file,
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
            storage_record.file,
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
            files=source.files,
            chunks=tuple(source.chunks),
            contents=tuple(source.contents),
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
