"""On CUDA, let cuDNN lay out each RNN's weights itself, then adopt its buffer.

memlayout's own RNN layout (`memlayout.core.cudnn_layout`) is cuDNN's as files that
cuDNN wrote show it. The cuDNN installed is the final word, though: after the
weights are in their flat CUDA buffers, each RNN's weights go through torch's
own flatten path — `flatten_parameters()` on a live module, the same
`torch._cudnn_rnn_flatten_weight` call for weights that have no module (a state
dict) — which allocates cuDNN's weight buffer, copies the weights in and points
them at it. That buffer then replaces the RNN's planned one, so what is saved,
verified and handed back is exactly what cuDNN laid out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.core.cudnn_layout import RnnGeometry, layout_of
from memlayout.core.facts import Facts
from memlayout.flatten.apply import modules_of, walk_tensors
from memlayout.flatten.plan import FlatBuffer, FlatPlan, Placement, ViewKey

if TYPE_CHECKING:
    import torch

RnnFlattener = Callable[[list["torch.Tensor"], RnnGeometry, Any], None]
"""Re-points the weights (in `_flat_weights_names` order) at a buffer it lays out;
the third argument is the live RNN module owning them, or None."""


def torch_flatten(weights: list[torch.Tensor], geometry: RnnGeometry, module: Any) -> None:
    """torch's own flatten path: `flatten_parameters()`, or the call it makes, for weights without a module."""
    import torch
    from torch.backends.cudnn import rnn

    if module is not None:
        module.flatten_parameters()
        return
    if not _torch.cudnn_flattens_rnn_weights():
        return  # as flatten_parameters() does where cuDNN's flatten is not used (ROCm)
    per_layer = (4 if geometry.bias else 2) + (1 if geometry.proj_size else 0)
    # tanh and relu have the same weights; an RNN recognized from a state dict is run as tanh.
    mode = "RNN_TANH" if geometry.mode == "RNN" else geometry.mode
    with torch.no_grad():
        _torch.cudnn_rnn_flatten_weight(
            weights, per_layer, geometry.input_size, rnn.get_cudnn_mode(mode), geometry.hidden_size,  # type: ignore[no-untyped-call]
            geometry.proj_size, geometry.num_layers, False, geometry.bidirectional,
        )


def _owner(obj: Any, weights: list[torch.Tensor]) -> Any:
    # The live RNN whose _flat_weights are exactly these tensor objects, if any.
    import torch


    ids = [id(w) for w in weights]
    for module in modules_of(obj):
        if isinstance(module, torch.nn.RNNBase) and [id(w) for w in _torch.rnn_flat_weights(module)] == ids:
            return module
    return None


def adopt_cudnn_layouts(
    obj: Any,
    plan: FlatPlan,
    buffers: list[torch.Tensor],
    facts: Facts,
    flatten: RnnFlattener = torch_flatten,
    device_types: tuple[str, ...] = ("cuda",),
) -> tuple[FlatPlan, list[torch.Tensor], list[str]]:
    """Hand each RNN buffer on CUDA to cuDNN and take the buffer it lays out instead.

    Args:
        obj: The object whose tensors `rebind` pointed at `buffers`.
        plan: The layout that was applied.
        buffers: The filled buffers, in plan order.
        facts: The facts the plan was made from.
        flatten: Lays the weights out (torch's own path by default).
        device_types: Devices whose RNN buffers are handed over.

    Returns:
        The plan and buffers with each adopted RNN buffer replaced, and notes for
        RNNs that torch's flatten path left alone (it returns early, for example,
        for a dtype cuDNN does not accept).
    """
    import torch


    objects: dict[tuple[int, tuple[int, ...]], list[torch.Tensor]] = {}
    seen: set[int] = set()
    for tensor in walk_tensors(obj):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            objects.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(tensor)
    records = {m.path: m.rnn for m in facts.modules if m.rnn is not None}
    new_buffers = list(buffers)
    new_flat = list(plan.buffers)
    placements = dict(plan.placements)
    notes: list[str] = []
    for index, flat in enumerate(plan.buffers):
        record = records.get(flat.rnn_module) if flat.rnn_module is not None else None
        # The buffer's own device, not the plan's: bytes moved on the CPU for a
        # checkpoint that keeps its CUDA device never meet cuDNN.
        if record is None or buffers[index].device.type not in device_types:
            continue
        layout = layout_of(facts, record)
        if isinstance(layout, str):
            continue
        planned = {name: (source, p) for source, (i, p) in plan.placements.items() if i == index for name in p.names}
        base = buffers[index].data_ptr()
        groups = []
        for name in record.flat_weight_names:
            source, placement = planned[name]
            groups.append((source, placement, objects[(base + placement.offset * placement.itemsize, placement.shape)]))
        weights = [group[0] for _, _, group in groups]
        flatten(weights, layout.geometry, _owner(obj, weights))
        storage = weights[0].untyped_storage()
        if storage.data_ptr() == base or any(w.untyped_storage().data_ptr() != storage.data_ptr() for w in weights):
            notes.append(f"{record.mode} {flat.rnn_module or '(root)'}: torch's cuDNN flatten left it alone; "
                         "memlayout's layout kept")
            continue
        with torch.no_grad():
            for _, _, group in groups:
                for alias in group[1:]:
                    alias.data = group[0].data
        new_flat[index], moved = _adopted(flat, groups)
        placements.update({source: (index, placement) for source, placement in moved.items()})
        new_buffers[index] = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
            storage, 0, (storage.nbytes(),), (1,)
        )
    if all(new is old for new, old in zip(new_buffers, buffers, strict=True)):
        return plan, buffers, notes
    adopted = replace(plan, buffers=tuple(new_flat), placements=placements, notes=(*plan.notes, *notes))
    return adopted, new_buffers, notes


def _adopted(
    flat: FlatBuffer, groups: list[tuple[ViewKey, Placement, list[torch.Tensor]]]
) -> tuple[FlatBuffer, dict[ViewKey, Placement]]:
    # The RNN buffer as cuDNN laid it out: each weight's slot where its tensor now is.
    weights = {source: tensors[0] for source, _, tensors in groups}
    moved: dict[ViewKey, Placement] = {}
    slots = []
    for slot in flat.slots:
        (placement,) = slot.views
        offset = int(weights[placement.source].storage_offset())
        moved[placement.source] = replace(placement, offset=offset)
        slots.append(replace(slot, start=offset * placement.itemsize, views=(moved[placement.source],)))
    storage = next(iter(weights.values())).untyped_storage()
    adopted = replace(flat, nbytes=storage.nbytes(), slots=tuple(sorted(slots, key=lambda s: s.start)))
    return adopted, moved
