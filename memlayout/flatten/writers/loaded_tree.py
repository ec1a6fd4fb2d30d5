"""Flatten an object tree that torch itself loaded, for formats flatten cannot stream.

torch.load cannot map a legacy file, and torch.jit.load and torch.export.load
hand back objects only they can build, so these writers let torch load IN and
then move the loaded tensors into the planned layout. The plan was made from
the file's records; each loaded tensor is matched to its record by name, and its
storage to the file's storage key, with offset, shape, stride and dtype checked,
so a tree that differs from the file in any way is refused rather than guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.errors import FlattenError, UsageError
from memlayout.flatten.apply import (
    allocate,
    as_bits,
    copy_from_storages,
    rebind,
    views_of,
    walk_tensors,
)
from memlayout.flatten.cudnn_adopt import adopt_cudnn_layouts
from memlayout.flatten.plan import FlatPlan
from memlayout.flatten.writers.interface import FlattenJob
from memlayout.load.live import load_live
from memlayout.load.live import storage_key as live_storage_key
from memlayout.load.records import LoadedSource

if TYPE_CHECKING:
    import torch


@dataclass
class Flattened:
    """The loaded tree after its tensors were moved into the flat buffers."""

    plan: FlatPlan
    """The plan that was applied (with cuDNN's own RNN buffers adopted on CUDA)."""
    buffers: list[torch.Tensor]
    bytes_copied: int
    locations: dict[int, str]
    """Moved on the host: the location each storage of the tree must record (its
    buffer's planned device, or IN's for a storage no view moved), by storage identity (`_torch.storage_id`).
    Empty when every buffer is on its planned device."""


def refuse_devices_not_here(source: LoadedSource, saver: str) -> None:
    """Raise when IN records a device this machine lacks and `saver` can only record devices it has.

    torch.jit.save and torch.export.save write the device each tensor is on, so
    keeping a CUDA archive's devices needs CUDA; only torch.save's persistent ids
    can be written with another device's name.

    Args:
        source: IN's records.
        saver: The function that writes OUT, for the message.

    Raises:
        UsageError: a recorded device is absent here.
    """
    import torch

    absent = []
    for device in sorted({s.device for s in source.storages.values()} - {"cpu", "meta"}):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            absent.append(device)
            continue
        index = parsed.index or 0
        if parsed.type != "cuda" or not torch.cuda.is_available() or index >= torch.cuda.device_count():
            absent.append(device)
    if absent:
        raise UsageError(
            f"{source.path} records tensors on {', '.join(absent)}, which this machine lacks, and {saver} "
            "records only the device a tensor is on",
            "pass --device cpu to move them to the CPU, or flatten on a machine with that device",
        )


def file_keys_by_name(tree: Any, job: FlattenJob) -> dict[str, str]:
    """The file's storage key of every storage of `tree`, by the live loader's storage key.

    Args:
        tree: What torch loaded (a state dict, a checkpoint, a module).
        job: The flatten job, whose facts are the file's records.

    Returns:
        Live storage key (`memlayout.load.live.storage_key`) -> file storage key.

    Raises:
        FlattenError: a loaded tensor has no record of its name in the file, or a
            different layout, or two loaded storages map to one file storage.
    """
    keys, slices = _match(tree, job)
    if slices:
        _reroot(tree, job, slices)
        keys, slices = _match(tree, job)
        assert not slices
    return keys


def _unexpected(job: FlattenJob, what: str) -> FlattenError:
    return FlattenError(f"{job.path}: {what}", "report it: memlayout reads this file differently from torch")


def _match(tree: Any, job: FlattenJob) -> tuple[dict[str, str], dict[str, list[tuple[int, int]]]]:
    """Live -> file storage keys; and, per file storage that torch split into slices, its tensors."""
    facts = job.facts
    keys: dict[str, str] = {}
    members: dict[str, list[tuple[int, int]]] = {}
    sliced: set[str] = set()
    for record in load_live(tree).tensors:
        fact = facts.tensor(record.name)
        if fact is None:
            raise _unexpected(job, f"torch loaded a tensor {record.name} that the file's records do not hold")
        if (record.shape, record.stride) != (fact.shape, fact.stride) or not record.dtype.endswith(fact.dtype):
            raise _unexpected(job, f"{record.name} loads as {record.dtype}{list(record.shape)} stride "
                              f"{list(record.stride)}, the file records {fact.dtype}{list(fact.shape)} stride "
                              f"{list(fact.stride)}")
        file_key = facts.storage(fact.storage).key
        assert record.object_id is not None
        members.setdefault(file_key, []).append((fact.offset, record.object_id))
        if record.offset != fact.offset:
            # torch's tar reader makes each storage view a storage of its own (a slice
            # of the root), where the file's records count from the root.
            sliced.add(file_key)
        elif keys.setdefault(record.storage_key, file_key) != file_key:
            raise _unexpected(job, f"{record.name} shares memory in torch's load that the file keeps apart")
    return keys, {key: members[key] for key in sliced}


def _reroot(tree: Any, job: FlattenJob, sliced: dict[str, list[tuple[int, int]]]) -> None:
    """Give every tensor of a sliced file storage one root storage at the file's offsets, values kept."""
    import torch

    by_id = {id(t): t for t in walk_tensors(tree)}
    sizes = {s.key: s.nbytes for s in job.facts.storages}
    with torch.no_grad():
        for file_key, members in sliced.items():
            root = torch.empty(sizes[file_key], dtype=torch.uint8).untyped_storage()
            for offset, object_id in members:
                tensor = by_id[object_id]
                if _torch.has_internal_overlap(tensor):
                    raise _unexpected(job, "an expanded tensor sits in a storage view, which flatten cannot re-root")
                view = torch.empty(0, dtype=tensor.dtype).set_(root, offset, tensor.shape, tensor.stride())
                as_bits(view).copy_(as_bits(tensor))
                tensor.data = view


def flatten_loaded_tree(tree: Any, job: FlattenJob, on_host: bool = False) -> Flattened:
    """Move every tensor of a tree torch loaded into the job's flat buffers, in place.

    Args:
        tree: The loaded object, or a dict of its tensors by the file's names (a
            scripted module's parameters, buffers and attributes). Its tensors are
            re-pointed (`tensor.data = view`), so every Python object, and every
            tie, is kept.
        job: The flatten job (plan, facts, options).
        on_host: Fill the buffers on the CPU whatever their planned device, for a
            writer that records the planned devices (`Flattened.locations`).

    Returns:
        The applied plan, the filled buffers, the bytes copied and, on the host,
        the locations to record.
    """
    named = tree
    keys = file_keys_by_name(named, job)
    storages: dict[str, Any] = {}
    locations: dict[int, str] = {}
    for tensor in walk_tensors(named):
        key = keys.get(live_storage_key(tensor))
        if key is not None:
            storages[key] = tensor.untyped_storage()
            if key in job.source.storages:
                locations[_torch.storage_id(storages[key])] = job.source.storages[key].device
    plan = job.plan
    buffers = allocate(plan, on="cpu" if on_host else None)
    copied = copy_from_storages(plan, buffers, storages)

    def key_of(tensor: torch.Tensor) -> str | None:
        return keys.get(live_storage_key(tensor))

    rebind(named, plan, views_of(plan, buffers), key_of)
    # On CUDA, cuDNN lays out each RNN itself and its buffer is what gets saved.
    plan, buffers, _ = adopt_cudnn_layouts(named, plan, buffers, job.facts)
    if not on_host:
        return Flattened(plan, buffers, copied, {})
    locations.update({_torch.storage_id(buffer.untyped_storage()): flat.device
                      for flat, buffer in zip(plan.buffers, buffers, strict=True)})
    return Flattened(plan, buffers, copied, locations)
