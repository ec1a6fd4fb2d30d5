"""Measuring a real step, independently of memlayout's tracer: PyTorch's MemTracker and a pack hook.

These are the references the predictions are checked against (tests and
benchmarks/bench_activations.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from memlayout.activations.step import pick_loss, run_step


@dataclass(frozen=True)
class RealStep:
    peak_bytes: int
    """MemTracker's peak over the step, with the model and the inputs tracked."""
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]


def memtracker_step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], seed: int = 0) -> RealStep:
    """Run one real step under torch.distributed._tools.MemTracker; returns its peak, the loss and the gradients."""
    from torch.distributed._tools.mem_tracker import MemTracker

    for parameter in model.parameters():
        parameter.grad = None
    tracker = MemTracker()
    tracker.track_external(model, *args, *kwargs.values())
    torch.manual_seed(seed)
    with tracker:
        loss, _ = run_step(model, args, kwargs)
    peak = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    for parameter in model.parameters():
        parameter.grad = None
    return RealStep(peak_bytes=int(peak), loss=loss, grads=grads)


def saved_bytes_seen_by_pack_hook(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """Bytes a saved_tensors_hooks pack hook sees in a real forward, once per storage, model state excluded,
    counting the storages still alive when backward would begin."""
    state = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: dict[int, tuple[Any, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in state:
            seen[id(storage)] = (weakref.ref(storage), storage.nbytes())
        return tensor

    torch.manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(*args, **kwargs)
        loss, _ = pick_loss(output)
        del output
        alive = {id(ref()): size for ref, size in seen.values() if ref() is not None}
    del loss
    return sum(alive.values())
