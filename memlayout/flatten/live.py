"""Flatten live objects in place: an nn.Module, a state dict or a training checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout.core.fact_builder import build_facts
from memlayout.core.facts import Facts
from memlayout.errors import UsageError
from memlayout.flatten.apply import (
    allocate,
    copy_from_storages,
    rebind,
    torch_dtype,
    views_of,
    walk_tensors,
)
from memlayout.flatten.cudnn_adopt import adopt_cudnn_layouts
from memlayout.flatten.handle import FlatGroup, FlatHandle
from memlayout.flatten.options import KEEP
from memlayout.flatten.plan import DEFAULT_ALIGN, FlatPlan, is_identity, plan_flatten
from memlayout.load.live import load_live, storage_key

if TYPE_CHECKING:
    import torch


def resolve_device(device: str | None) -> str | None:
    """A concrete device string ("cpu", "cuda:0"), or None to keep each tensor's.

    Args:
        device: None or "keep" (each tensor stays where it is), "auto" (CUDA when
            available, else CPU), "cpu", "cuda" or "cuda:N".

    Returns:
        The device as tensors report it.

    Raises:
        UsageError: unknown device, or CUDA asked for where there is none.
    """
    import torch

    if device is None or device == KEEP:
        return None
    if device == "auto":
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise UsageError(f"unknown device {device!r}", "use keep, auto, cpu, cuda or cuda:N") from exc
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: CUDA is not available here", "use --device keep, cpu or auto")
        index = parsed.index if parsed.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")
        return f"cuda:{index}"
    if parsed.type != "cpu":
        raise UsageError(f"--device {device} is not supported", "use keep, auto, cpu, cuda or cuda:N")
    return "cpu"


def live_facts(obj: Any) -> Facts:
    """Facts of a live object, as `memlayout.inspect` sees it."""
    return build_facts(load_live(obj))


def _live_storages(obj: Any) -> dict[str, Any]:
    return {storage_key(t): t.untyped_storage() for t in walk_tensors(obj)}


def groups_of(plan: FlatPlan, buffers: list[torch.Tensor]) -> list[FlatGroup]:
    """A `FlatGroup` per buffer: its bytes viewed as one tensor of the group's dtype."""
    groups = []
    for flat, buffer in zip(plan.buffers, buffers, strict=True):
        dtype = torch_dtype(flat.dtype)
        itemsize = dtype.itemsize
        data = (buffer.view(dtype) if buffer.numel() % itemsize == 0
                else buffer[: buffer.numel() // itemsize * itemsize].view(dtype))
        names = tuple(name for slot in flat.slots for view in slot.views for name in view.names)
        groups.append(FlatGroup(flat.label, flat.key, data, names, rnn_module=flat.rnn_module))
    return groups


def _existing_buffers(plan: FlatPlan, storages: dict[str, Any]) -> list[torch.Tensor]:
    import torch

    buffers = []
    for flat in plan.buffers:
        storage = storages[flat.slots[0].views[0].source[0]]
        whole = torch.empty(0, dtype=torch.uint8, device=storage.device)
        whole.set_(storage, 0, (storage.nbytes(),), (1,))
        buffers.append(whole)
    return buffers


def _attach_grads(obj: Any, plan: FlatPlan, groups: list[FlatGroup], buffers: list[torch.Tensor]) -> None:
    import torch

    by_pointer = {}
    for index, (group, buffer) in enumerate(zip(groups, buffers, strict=True)):
        if group.is_parameters and any(slot.views for slot in plan.buffers[index].slots):
            grad_buffer = torch.zeros_like(buffer)
            group.grad = grad_buffer.view(group.data.dtype)[: group.data.numel()]
            by_pointer[buffer.untyped_storage().data_ptr()] = grad_buffer
    seen: set[int] = set()
    for tensor in walk_tensors(obj):
        if not isinstance(tensor, torch.nn.Parameter) or not tensor.requires_grad or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        flat_grad = by_pointer.get(tensor.untyped_storage().data_ptr())
        if flat_grad is None:
            continue
        grad = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        grad.set_(flat_grad.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
        if tensor.grad is not None:
            grad.copy_(tensor.grad)
        tensor.grad = grad


def flatten_object(
    obj: Any,
    device: str | None = None,
    align: int = DEFAULT_ALIGN,
    grads: bool = False,
    share_memory: bool = False,
    pin_memory: bool = False,
) -> FlatHandle:
    """Flatten a live module, state dict or checkpoint in place.

    Args:
        obj: The object; its tensor objects are kept and re-pointed at flat buffers.
        device: Target device ("auto", "cpu", "cuda", "cuda:N"); None keeps devices.
        align: Slot alignment in bytes (a power of two).
        grads: Give parameters a parallel flat `.grad` buffer.
        share_memory: Allocate CPU buffers in shared memory.
        pin_memory: Allocate CPU buffers pinned.

    Returns:
        A `FlatHandle` with one `FlatGroup` per buffer.
    """
    target = resolve_device(device)
    facts = live_facts(obj)
    plan = plan_flatten(facts, align=align, device=target)
    storages = _live_storages(obj)
    fresh_memory = share_memory or pin_memory
    if is_identity(plan, facts) and not fresh_memory and all(
        target is None or flat.device == storages[flat.slots[0].views[0].source[0]].device.__str__()
        for flat in plan.buffers
    ):
        buffers = _existing_buffers(plan, storages)
        changed, copied = False, 0
    else:
        buffers = allocate(plan, pin_memory=pin_memory, share_memory=share_memory)
        copied = copy_from_storages(plan, buffers, storages)
        rebind(obj, plan, views_of(plan, buffers), storage_key)
        # On CUDA, torch's own flatten_parameters() lays out each RNN for the cuDNN
        # installed, and the handle holds the buffer it made.
        plan, buffers, _ = adopt_cudnn_layouts(obj, plan, buffers, facts)
        changed = True
    groups = groups_of(plan, buffers)
    if grads:
        _attach_grads(obj, plan, groups, buffers)
    return FlatHandle(plan, groups, changed, copied, plan.notes)
