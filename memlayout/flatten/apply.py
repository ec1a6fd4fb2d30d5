"""Carry out a `FlatPlan`: allocate the flat buffers, fill them, point tensors at them.

Tensors are re-pointed with `tensor.data = view`, which keeps every Python object:
a tied Parameter stays one object under all its names, optimizers holding the
parameters keep working, and an RNN's `_flat_weights` (the same Parameter objects)
sees the new memory. Sources are read either from live storages or straight from
a torch.save file with `os.preadv` into the slot, so a file's pages are never
mapped into the process a second time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.core.object_tree import tree_leaves
from memlayout.errors import FlattenError, UsageError
from memlayout.flatten.plan import FlatPlan, Placement, Slot, ViewKey
from memlayout.flatten.populate import populate

if TYPE_CHECKING:
    import torch

# Pinned staging for host-to-CUDA copies: two chunks so the disk read of one
# overlaps the transfer of the other, small enough to never matter for memory.
STAGING_BYTES = 64 << 20
# Linux returns at most 0x7ffff000 bytes per read call; ask for less and loop.
MAX_READ_BYTES = 1 << 30


def host_bytes(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a CPU uint8 tensor's bytes (for pread into it)."""
    array: Any = tensor.numpy()
    return memoryview(array)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for memlayout's short dtype name ("float32")."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise FlattenError(f"dtype {name} is not known to this torch", "upgrade torch")
    return dtype


def as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor reinterpreted as a same-size integer type."""
    # Same-size integer reinterpretation, so a copy moves bits (NaN payloads
    # included) and never converts values. Allowed for any strides.
    import torch

    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    size = tensor.element_size()
    return tensor.view(by_size[size]) if size in by_size else tensor


def word_size(*values: int) -> int:
    """The widest of 8, 4, 2 and 1 bytes that divides every value (addresses, offsets, lengths)."""
    combined = 8
    for value in values:
        combined |= value
    return combined & -combined


def words(storage: Any, start: int, nbytes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Bytes [start, start + nbytes) of a storage as a 1-D tensor of `dtype`, whose size divides both."""
    import torch

    view = torch.empty(0, dtype=dtype, device=device)
    view.set_(storage, start // dtype.itemsize, (nbytes // dtype.itemsize,), (1,))
    return view


def allocate(
    plan: FlatPlan, pin_memory: bool = False, share_memory: bool = False, on: str | None = None
) -> list[torch.Tensor]:
    """One uint8 tensor per plan buffer, padding already zero.

    Args:
        plan: The layout.
        on: Allocate every buffer on this device instead of its planned one (flatten
            moves bytes on the CPU when OUT only records the planned devices).
        pin_memory: Allocate CPU buffers in page-locked memory (one pinned H2D copy).
        share_memory: Put CPU buffers in shared memory (one segment for Hogwild workers).

    Returns:
        The buffers, in plan order.
    """
    import torch

    if pin_memory and not torch.cuda.is_available():
        raise UsageError("pin_memory needs CUDA, and none is available", "drop pin_memory on CPU-only machines")
    buffers = []
    for flat in plan.buffers:
        device = torch.device(on or flat.device)
        pin = pin_memory and device.type == "cpu"
        buffer = torch.empty(flat.nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
        if share_memory and device.type == "cpu":
            buffer.share_memory_()  # type: ignore[no-untyped-call]
        populate(buffer)
        # Only the gaps are zeroed: touching every page twice would halve throughput
        # on a fresh allocation, which is page-fault bound.
        cursor = 0
        for slot in flat.slots:
            if slot.start > cursor:
                buffer[cursor : slot.start].zero_()
            cursor = max(cursor, slot.start + slot.nbytes)
        if flat.nbytes > cursor:
            buffer[cursor:].zero_()
        buffers.append(buffer)
    return buffers


def view_of(buffer: torch.Tensor, placement: Placement) -> torch.Tensor:
    """The tensor a placement describes, viewing `buffer`'s storage."""
    import torch

    view = torch.empty(0, dtype=torch_dtype(placement.dtype), device=buffer.device)
    view.set_(buffer.untyped_storage(), placement.offset, placement.shape, placement.stride)
    return view


def views_of(plan: FlatPlan, buffers: list[torch.Tensor]) -> dict[ViewKey, torch.Tensor]:
    """Every planned view, built on the filled buffers."""
    return {key: view_of(buffers[index], placement) for key, (index, placement) in plan.placements.items()}


def _storage_bytes(storage: Any, device: torch.device) -> torch.Tensor:
    import torch

    whole = torch.empty(0, dtype=torch.uint8, device=device)
    whole.set_(storage, 0, (storage.nbytes(),), (1,))
    return whole


def _dense_destination(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    return view_of(buffer, slot.views[0])


def _source_view(source_bytes: torch.Tensor, slot: Slot, base: int) -> torch.Tensor:
    # The single view of a dense slot, rebuilt on bytes whose byte 0 is source byte `base`.
    import torch

    _, offset, shape, stride, dtype = slot.views[0].source
    itemsize = slot.views[0].itemsize
    view = torch.empty(0, dtype=torch_dtype(dtype), device=source_bytes.device)
    view.set_(source_bytes.untyped_storage(), source_bytes.storage_offset() // itemsize + offset - base // itemsize,
              shape, stride)
    return view


def copy_from_storages(plan: FlatPlan, buffers: list[torch.Tensor], storages: dict[str, Any]) -> int:
    """Fill buffers from live storages (any device to any device).

    Args:
        plan: The layout.
        buffers: From `allocate`.
        storages: Loader storage key -> torch.UntypedStorage.

    Returns:
        Bytes copied.
    """
    import torch

    # Byte regions move as the widest integer words both ends are aligned to: torch's
    # CPU copy splits and vectorizes per element, and 1 GiB in 400 slots copied as
    # uint8 took 71 ms against 63 ms as int64. Views are made straight on the
    # storages, because slicing and reinterpreting per slot cost more than the copy
    # of a small tensor.
    word_dtypes = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    copied = 0
    for flat, buffer in zip(plan.buffers, buffers, strict=True):
        target, device, offset = buffer.untyped_storage(), buffer.device, int(buffer.storage_offset())
        target_base = buffer.data_ptr() - offset
        for slot in flat.slots:
            if slot.source_nbytes == 0:
                continue
            storage = storages[slot.source_storage]
            if slot.dense:
                whole = _storage_bytes(storage, storage.device)
                as_bits(_dense_destination(buffer, slot)).copy_(as_bits(_source_view(whole, slot, 0)))
            else:
                start = offset + slot.start
                dtype = word_dtypes[word_size(target_base, storage.data_ptr(), start, slot.source_start, slot.nbytes)]
                words(target, start, slot.nbytes, dtype, device).copy_(
                    words(storage, slot.source_start, slot.nbytes, dtype, storage.device)
                )
            copied += slot.nbytes
    return copied


def pread_into(fd: int, target: memoryview, offset: int) -> None:
    """Fill `target` from `fd` at `offset`, looping over short reads."""
    done = 0
    while done < len(target):
        count = os.preadv(fd, [target[done : done + MAX_READ_BYTES]], offset + done)
        if count <= 0:
            raise FlattenError(f"the file ended {len(target) - done} bytes early while reading at {offset + done}")
        done += count


@dataclass
class _CudaStager:
    """Reads file ranges into pinned chunks and sends them to a CUDA buffer, overlapped."""

    fd: int

    def __post_init__(self) -> None:
        import torch

        self.chunks = [torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.events: list[Any] = [None, None]
        self.turn = 0

    def send(self, target: torch.Tensor, offset: int) -> None:
        import torch

        for start in range(0, target.numel(), STAGING_BYTES):
            length = min(STAGING_BYTES, target.numel() - start)
            chunk = self.chunks[self.turn]
            if self.events[self.turn] is not None:
                self.events[self.turn].synchronize()
            pread_into(self.fd, host_bytes(chunk)[:length], offset + start)
            target[start : start + length].copy_(chunk[:length], non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self.events[self.turn] = event
            self.turn ^= 1

    def finish(self) -> None:
        for event in self.events:
            if event is not None:
                event.synchronize()


def copy_from_file(plan: FlatPlan, buffers: list[torch.Tensor], path: str, file_offsets: dict[str, int]) -> int:
    """Fill buffers by reading each slot's source bytes straight from a file.

    Args:
        plan: The layout; source storage keys are keys of `file_offsets`.
        buffers: From `allocate`, on CPU or CUDA.
        path: The uncompressed checkpoint file.
        file_offsets: Storage key -> absolute offset of its first byte in the file.

    Returns:
        Bytes copied.
    """
    import torch

    copied = 0
    fd = os.open(path, os.O_RDONLY)
    stager: _CudaStager | None = None
    try:
        for flat, buffer in zip(plan.buffers, buffers, strict=True):
            on_cpu = buffer.device.type == "cpu"
            if not on_cpu and stager is None:
                stager = _CudaStager(fd)
            host = host_bytes(buffer) if on_cpu else None
            for slot in flat.slots:
                if slot.source_nbytes == 0:
                    continue
                where = file_offsets[slot.source_storage] + slot.source_start
                if slot.dense:
                    # A strided view alone: read its span, then copy values into dense order.
                    span = torch.empty(slot.source_nbytes, dtype=torch.uint8)
                    pread_into(fd, host_bytes(span), where)
                    source = _source_view(span, slot, slot.source_start)
                    as_bits(_dense_destination(buffer, slot)).copy_(as_bits(source))
                elif host is not None:
                    pread_into(fd, host[slot.start : slot.start + slot.nbytes], where)
                else:
                    assert stager is not None
                    stager.send(buffer[slot.start : slot.start + slot.nbytes], where)
                copied += slot.nbytes
        if stager is not None:
            stager.finish()
    finally:
        os.close(fd)
    return copied


def walk_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every strided tensor object a flattenable tree holds (modules, dicts, lists, tuples).

    Mirrors what the loaders record: a module's parameters and buffers under every
    name, containers recursively. Weight-dropout shadows are skipped: they are
    recomputed every forward.
    """
    import torch

    modules: set[int] = set()
    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            if leaf.layout == torch.strided:
                yield leaf
        elif isinstance(leaf, torch.nn.Module) and id(leaf) not in modules:
            modules.add(id(leaf))
            for _, param in leaf.named_parameters(remove_duplicate=False):
                yield param
            for _, buffer in leaf.named_buffers(remove_duplicate=False):
                yield buffer


def tensor_view_key(tensor: torch.Tensor, storage_key: str) -> ViewKey:
    """The `ViewKey` of a live tensor, given its storage's loader key."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return (storage_key, int(tensor.storage_offset()), tuple(tensor.shape), tuple(tensor.stride()), dtype)


def rebind(
    obj: Any, plan: FlatPlan, views: dict[ViewKey, torch.Tensor], storage_key: Callable[[torch.Tensor], str | None]
) -> int:
    """Point every tensor of `obj` at its planned view, keeping each Python object.

    Args:
        obj: The module, state dict or checkpoint the plan was made from.
        plan: The layout.
        views: From `views_of`.
        storage_key: The loader key of a tensor's storage; None for tensors to leave.

    Returns:
        How many tensor objects were re-pointed.

    Raises:
        FlattenError: a tensor matches no planned view (the tree changed since planning).
    """
    import torch

    untouched = set(plan.untouched)
    # Decide every target first: re-pointing one object changes what its ties look like.
    targets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for tensor in walk_tensors(obj):
        if id(tensor) in targets:
            continue
        key = storage_key(tensor)
        if key is None:
            continue
        view = tensor_view_key(tensor, key)
        if view in untouched:
            continue
        if view not in views:
            raise FlattenError(
                f"a {tuple(tensor.shape)} {tensor.dtype} tensor matches no planned slot",
                "the object changed while flattening; flatten again",
            )
        targets[id(tensor)] = (tensor, views[view])
    with torch.no_grad():
        for tensor, new in targets.values():
            tensor.data = new
    for module in modules_of(obj):
        if isinstance(module, torch.nn.RNNBase):
            # Identity is kept, so the weakrefs already match; rebuilding the list is
            # cheap insurance against wrappers that swapped entries in between.
            _torch.refresh_rnn_flat_weights(module)
    return len(targets)


def modules_of(obj: Any) -> Iterator[Any]:
    """Every nn.Module a flattenable tree holds, submodules included."""
    import torch

    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.nn.Module):
            yield from leaf.modules()
