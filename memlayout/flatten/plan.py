"""Plan a flat layout: facts in, buffers and slots out. Pure: no torch, no I/O.

A *region* is a run of one storage whose views' byte spans meet; it is the unit
that moves. A region with one view of a tensor is copied dense (contiguous, or
channels_last if it was); a region with several views is copied byte for byte
from its first to its last used byte, so every view keeps its offset and strides
relative to the others and ties such as `decoder.weight = encoder.weight.t()`
survive as views of one slot. Regions never merge, so no new sharing appears.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from memlayout.core.cudnn_layout import CudnnLayout, layout_of, local_name, rnn_layout_problem
from memlayout.core.facts import FLAT_BUFFER_ALIGNMENT, Facts, TensorFact
from memlayout.core.flat_groups import flat_group_key, with_device
from memlayout.core.strides import MemoryFormat, dense_strides_in_order, memory_format
from memlayout.errors import FlattenError, UsageError
from memlayout.format_bytes import counted
from memlayout.load.records import ModuleRecord, TensorKind

DEFAULT_ALIGN = FLAT_BUFFER_ALIGNMENT
"""Where slots start and buffers end by default; core's facts read the same number to
tell this padding from bloat."""

ViewKey = tuple[str, int, tuple[int, ...], tuple[int, ...], str]
"""(loader storage key, element offset, shape, stride, dtype): one distinct view."""


@dataclass(frozen=True)
class Placement:
    """Where one distinct view lands in its flat buffer."""

    source: ViewKey
    """The view before flattening."""
    names: tuple[str, ...]
    """Every name that reaches the view."""
    kind: TensorKind
    dtype: str
    itemsize: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    """Strides after flattening (dense for a view alone in its region)."""
    offset: int
    """Element offset in the flat buffer."""


@dataclass(frozen=True)
class Slot:
    """One region of a source storage and its place in a flat buffer."""

    start: int
    """Byte offset in the buffer; a multiple of the plan's alignment (or where cuDNN puts the weight, for RNNs)."""
    nbytes: int
    source_storage: str
    """The loader's storage key the bytes come from."""
    source_start: int
    """First source byte read."""
    source_nbytes: int
    """Bytes read from the source: `nbytes` for a byte copy, the view's span for a dense copy."""
    dense: bool
    """True: the single view's values are copied into dense strides. False: bytes
    [source_start, source_start + nbytes) are copied as they are."""
    views: tuple[Placement, ...]


@dataclass(frozen=True)
class FlatBuffer:
    """One flat allocation: a group of tensors, contiguous, aligned."""

    label: str
    """Human name, e.g. "model params float32 cpu (requires_grad)" or "rnn encoder.lstm"."""
    key: tuple[str, ...]
    """The `flat_group_key` of its tensors, or ("rnn", module path)."""
    device: str
    dtype: str
    """dtype of the group (a region may hold other dtypes' views of the same bytes)."""
    nbytes: int
    slots: tuple[Slot, ...]
    rnn_module: str | None = None
    """Set for an RNN's own buffer, laid out as cuDNN's weight space from byte 0."""

    @property
    def used_bytes(self) -> int:
        return sum(slot.nbytes for slot in self.slots)

    @property
    def padding_bytes(self) -> int:
        return self.nbytes - self.used_bytes


@dataclass(frozen=True)
class FlatPlan:
    """The flat layout of a whole source."""

    buffers: tuple[FlatBuffer, ...]
    align: int
    asked_align: int | None = None
    """The alignment asked for (`--align`, `alignment` in [tool.memlayout]); None where `align` is
    flatten's own default. A format whose own standard is less (safetensors' data section on 8
    bytes) is left as its writer laid it out unless asked."""
    untouched: tuple[ViewKey, ...] = ()
    """Views left where they are: empty tensors of empty storages, and weights that a
    weight-dropout wrapper recomputes every forward."""
    notes: tuple[str, ...] = ()
    """What flatten cannot fix, for the user (ML402 and RNNs it had to treat as plain tensors)."""
    placements: dict[ViewKey, tuple[int, Placement]] = field(default_factory=dict, compare=False, repr=False)
    """Each view's (buffer index, placement)."""

    @property
    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in self.buffers)

    @property
    def padding_bytes(self) -> int:
        return sum(buffer.padding_bytes for buffer in self.buffers)


def view_key(tensor: TensorFact, facts: Facts) -> ViewKey:
    """The identity of a view in loader terms, which `apply` recomputes from live tensors."""
    return (facts.storage(tensor.storage).key, tensor.offset, tensor.shape, tensor.stride, tensor.dtype)


def dense_strides(shape: tuple[int, ...], fmt: MemoryFormat) -> tuple[int, ...]:
    """Strides of a dense tensor of `shape` in format `fmt` (as torch computes them)."""
    if fmt is MemoryFormat.CHANNELS_LAST and len(shape) == 4:
        order: tuple[int, ...] = (1, 3, 2, 0)
    elif fmt is MemoryFormat.CHANNELS_LAST_3D and len(shape) == 5:
        order = (1, 4, 3, 2, 0)
    else:
        order = tuple(reversed(range(len(shape))))
    return dense_strides_in_order(shape, tuple(reversed(order)))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass
class _Region:
    storage: str
    views: list[TensorFact]
    start: int
    end: int


def _regions(facts: Facts, tensors: list[TensorFact]) -> dict[str, _Region]:
    """Region of each view name, merging views whose byte spans meet."""
    by_storage: dict[str, list[TensorFact]] = defaultdict(list)
    for tensor in tensors:
        by_storage[tensor.storage].append(tensor)
    region_of: dict[str, _Region] = {}
    for storage_id, views in by_storage.items():
        key = facts.storage(storage_id).key
        current: _Region | None = None
        # Most storages hold one view: sorting a one-item list still costs a key call.
        ordered = views if len(views) == 1 else sorted(views, key=lambda v: (v.bytes_used.start, -v.bytes_used.end))
        for view in ordered:
            start, end = view.bytes_used.start, view.bytes_used.end
            if current is None or start >= current.end:
                current = _Region(key, [], start, end)
            current.views.append(view)
            current.end = max(current.end, end)
            region_of[view.name] = current
    return region_of


def _group_rep(region: _Region) -> TensorFact:
    # A region holding a parameter is placed with the parameters: its tie partner
    # (a transposed decoder, a buffer alias) follows the parameter, not the reverse.
    return next((v for v in region.views if v.kind is TensorKind.PARAMETER), region.views[0])


def _rnn_weights(
    facts: Facts, module: ModuleRecord, region_of: dict[str, _Region]
) -> tuple[list[TensorFact], CudnnLayout] | str:
    """The RNN's weights in `_flat_weights_names` order and cuDNN's layout for them,
    or why flatten cannot give the RNN its own buffer."""
    assert module.rnn is not None
    weights = []
    for name in module.rnn.flat_weight_names:
        tensor = facts.tensor(name)
        if tensor is None or tensor.name not in region_of:
            return f"weight {name} is missing"
        if len(region_of[tensor.name].views) > 1:
            return f"weight {name} shares memory with {region_of[tensor.name].views[0].name}"
        if tensor.self_overlapping:
            return f"weight {name} is an expanded view"
        weights.append(tensor)
    if len({w.name for w in weights}) < len(weights):
        return "two of its weights are the same tensor, which cuDNN cannot use in place"
    if len({(w.dtype, w.device) for w in weights}) > 1:
        return "its weights mix dtypes or devices"
    layout = layout_of(facts, module.rnn)
    if isinstance(layout, str):
        return layout
    return weights, layout


def check_align(align: int) -> None:
    """Raise `UsageError` unless `align` is a power of two."""
    if align < 1 or align & (align - 1):
        raise UsageError(f"--align {align} is not a power of two", "use 64 (the default), 16, 128 or 4096")


def plan_flatten(facts: Facts, align: int | None = None, device: str | None = None) -> FlatPlan:
    """Decide the flat layout of every tensor in `facts`.

    Args:
        facts: Layout facts of a module, state dict or checkpoint with real data.
        align: Every slot starts at a multiple of this many bytes (a power of two);
            None for `DEFAULT_ALIGN`, as flatten's own choice rather than one asked for.
        device: Target device for every buffer ("cpu", "cuda:0"); None keeps each
            tensor's device.

    Returns:
        A `FlatPlan`: parameters grouped per (section, device, dtype, requires_grad),
        other tensors per (section, device, dtype), each RNN in its own buffer.

    Raises:
        UsageError: `align` is not a power of two.
        FlattenError: a tensor has no data (meta device, metadata-only source).
    """
    asked = align
    align = DEFAULT_ALIGN if align is None else align
    check_align(align)
    shadowed = {name for m in facts.modules if m.rnn for name in m.rnn.unregistered}
    notes: list[str] = []
    untouched: list[ViewKey] = []
    placed: list[TensorFact] = []
    for tensor in facts.tensors:
        if shadowed.intersection(tensor.names) and tensor.kind is not TensorKind.PARAMETER:
            # Recomputed by the wrapper on every forward: moving it achieves nothing.
            untouched.append(view_key(tensor, facts))
            continue
        if not tensor.has_data:
            raise FlattenError(
                f"{tensor.name} has no data ({tensor.device} tensor or metadata-only source)",
                "materialize the model (e.g. `to_empty` and load weights) before flattening",
            )
        if tensor.numel == 0 and facts.storage(tensor.storage).nbytes == 0:
            untouched.append(view_key(tensor, facts))
            continue
        placed.append(tensor)
    region_of = _regions(facts, [t for t in placed if t.numel > 0])

    for module in facts.modules:
        if module.rnn and module.rnn.unregistered:
            notes.append(
                f"{module.rnn.mode} {module.path or '(root)'}: {', '.join(module.rnn.unregistered)} "
                "are recomputed every forward by a weight-dropout wrapper; flatten cannot fix that (ML402)"
            )

    # Group order follows first appearance, and slots follow first appearance
    # within a group, so flattening a flat source reproduces its layout exactly.
    groups: dict[tuple[str, ...], list[_Region | TensorFact]] = {}
    group_rep: dict[tuple[str, ...], TensorFact] = {}
    assigned: set[int] = set()
    rnn_of: dict[str, tuple[str, ...]] = {}
    rnn_starts: dict[str, int] = {}
    rnn_numel: dict[tuple[str, ...], int] = {}
    for module in facts.modules:
        if module.rnn is None or module.rnn.unregistered:
            continue
        found = _rnn_weights(facts, module, region_of)
        if isinstance(found, str):
            if rnn_layout_problem(facts, module.rnn) is not None:
                notes.append(f"{module.rnn.mode} {module.path or '(root)'}: not given its own buffer: {found}")
            continue
        weights, layout = found
        if any(id(region_of[w.name]) in assigned for w in weights):
            continue  # the same RNN object reached under a second path
        rnn_key: tuple[str, ...] = ("rnn", module.path)
        for name, weight in zip(module.rnn.flat_weight_names, weights, strict=True):
            rnn_of[weight.name] = rnn_key
            rnn_starts[weight.name] = layout.slot(local_name(name)).offset * weight.itemsize
            assigned.add(id(region_of[weight.name]))
        # Slots in buffer order: cuDNN's offsets, not the weights' name order.
        groups[rnn_key] = [region_of[w.name] for w in sorted(weights, key=lambda w: rnn_starts[w.name])]
        group_rep[rnn_key] = weights[0]
        rnn_numel[rnn_key] = layout.numel

    # Groups appear in source order; an RNN group sits where its first weight does.
    ordered_keys: list[tuple[str, ...]] = []
    for tensor in placed:
        key: tuple[str, ...]
        region: _Region | TensorFact = region_of[tensor.name] if tensor.numel > 0 else tensor
        if tensor.name in rnn_of:
            key = rnn_of[tensor.name]
        elif isinstance(region, _Region):
            if id(region) in assigned:
                continue
            assigned.add(id(region))
            rep = _group_rep(region)
            key = with_device(flat_group_key(rep), device)
            groups.setdefault(key, []).append(region)
            group_rep.setdefault(key, rep)
        else:
            key = with_device(flat_group_key(tensor), device)
            groups.setdefault(key, []).append(region)
            group_rep.setdefault(key, tensor)
        if key not in ordered_keys:
            ordered_keys.append(key)

    buffers: list[FlatBuffer] = []
    placements: dict[ViewKey, tuple[int, Placement]] = {}
    for key in ordered_keys:
        rep = group_rep[key]
        is_rnn = key[0] == "rnn"
        buffer_device = device or rep.device
        slots = []
        cursor = 0
        for member in groups[key]:
            if is_rnn:
                # cuDNN's layout: each weight at its own offset, gaps (bias space of an
                # RNN without bias) left zero.
                assert isinstance(member, _Region)
                slot = _place(facts, member, rnn_starts[member.views[0].name], 1)
            else:
                slot = _place(facts, member, cursor, align)
            slots.append(slot)
            cursor = slot.start + slot.nbytes
            for placement in slot.views:
                placements[placement.source] = (len(buffers), placement)
        # try_get_weight_buf takes the whole storage as the weight space: make it
        # exactly as long as cuDNN's (bias space included).
        nbytes = rnn_numel[key] * rep.itemsize if is_rnn else _round_up(cursor, max(align, rep.itemsize))
        label = f"rnn {key[1] or '(root)'}" if is_rnn else _label(key)
        buffers.append(
            FlatBuffer(label, key, buffer_device, rep.dtype, nbytes, tuple(slots), key[1] if is_rnn else None)
        )
    return FlatPlan(tuple(buffers), align, asked, tuple(untouched), tuple(notes), placements)


def _label(key: tuple[str, ...]) -> str:
    section, role, device, dtype, grad = key
    what = "params" if role == "param" else "tensors"
    grad_text = " requires_grad" if grad == "True" else (" frozen" if grad == "False" else "")
    return f"{section + ' ' if section else ''}{what} {dtype} {device}{grad_text}"


def _place(facts: Facts, member: _Region | TensorFact, cursor: int, align: int) -> Slot:
    if isinstance(member, TensorFact):
        # An empty view of a non-empty storage: it needs no bytes, only to leave the storage.
        start = _round_up(cursor, max(align, member.itemsize))
        stride = dense_strides(member.shape, MemoryFormat.CONTIGUOUS)
        placement = _placement(facts, member, stride, start // member.itemsize)
        return Slot(start, 0, facts.storage(member.storage).key, 0, 0, True, (placement,))
    views = member.views
    itemsize = max(v.itemsize for v in views)
    start = _round_up(cursor, max(align, itemsize))
    if len(views) == 1 and not views[0].self_overlapping:
        view = views[0]
        fmt = memory_format(view.shape, view.stride)
        dense = fmt is MemoryFormat.STRIDED
        stride = dense_strides(view.shape, fmt) if dense else view.stride
        placement = _placement(facts, view, stride, start // view.itemsize)
        span = member.end - member.start
        return Slot(start, view.nbytes if dense else span, member.storage, member.start, span, dense, (placement,))
    # Several views (or one expanded view): copy the bytes from the first used byte,
    # rounded down so every view's offset stays a whole number of its elements.
    source_start = member.start - member.start % itemsize
    placed = tuple(
        _placement(facts, v, v.stride, (start + v.offset * v.itemsize - source_start) // v.itemsize) for v in views
    )
    span = member.end - source_start
    return Slot(start, span, member.storage, source_start, span, False, placed)


def _placement(facts: Facts, view: TensorFact, stride: tuple[int, ...], offset: int) -> Placement:
    return Placement(view_key(view, facts), view.names, view.kind, view.dtype, view.itemsize, view.shape, stride,
                     offset)


def is_identity(plan: FlatPlan, facts: Facts) -> bool:
    """Whether the source already has exactly the planned layout (flatten would change nothing).

    Args:
        plan: The plan made from `facts`.
        facts: The source's facts.

    Returns:
        True when each buffer is one whole storage of the planned size holding
        every view at its planned offset and strides, and no storage serves two buffers.
    """
    return not describe_changes(plan, facts)


def describe_changes(plan: FlatPlan, facts: Facts, limit: int = 20) -> list[str]:
    """What flattening would change, one line each; empty when the source is already flat.

    Args:
        plan: The plan made from `facts`.
        facts: The source's facts.
        limit: At most this many per-tensor lines (a count of the rest follows).

    Returns:
        Human-readable lines for `memlayout flatten --check`.
    """
    lines: list[str] = []
    storages = {s.key: s for s in facts.storages}
    storage_of_buffer: dict[int, set[str]] = defaultdict(set)
    buffers_of_storage: dict[str, set[int]] = defaultdict(set)
    details: list[str] = []
    for source, (index, placement) in plan.placements.items():
        storage_of_buffer[index].add(source[0])
        buffers_of_storage[source[0]].add(index)
        name = placement.names[0]
        _, offset, _, stride, _ = source
        if stride != placement.stride:
            details.append(f"{name}: strides {list(stride)} -> {list(placement.stride)} (made dense)")
        elif offset != placement.offset:
            details.append(f"{name}: moves from element {offset} to {placement.offset} of its buffer")
    before = len({k for k in storages if k not in {u[0] for u in plan.untouched}})
    if before != len(plan.buffers) or any(len(v) > 1 for v in storage_of_buffer.values()) or any(
        len(v) > 1 for v in buffers_of_storage.values()
    ):
        lines.append(f"{counted(before, 'storage')} become {counted(len(plan.buffers), 'flat buffer')}")
    for index, buffer in enumerate(plan.buffers):
        keys = storage_of_buffer[index]
        if len(keys) == 1:
            storage = storages[next(iter(keys))]
            if storage.nbytes != buffer.nbytes:
                lines.append(
                    f"{buffer.label}: storage {storage.id} is {storage.nbytes} bytes, flat is {buffer.nbytes}"
                )
    lines.extend(details[:limit])
    if len(details) > limit:
        lines.append(f"... and {len(details) - limit} more tensors move")
    return lines
