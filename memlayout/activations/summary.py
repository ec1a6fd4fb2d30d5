"""What a trace says: the peak and where it happens, what is saved for backward, per-module costs.

Pure functions of a `Trace`; numpy does the sweeps over events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memlayout.activations.device.allocator_replay import allocator_peaks
from memlayout.activations.facts import ModuleCall, Phase, StorageKind, Trace

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class PeakAt:
    """Where the peak happens."""

    module: str | None
    """The innermost module's path ("" is the model itself); None outside every module."""
    class_name: str | None
    phase: str


@dataclass(frozen=True)
class Summary:
    """The step's totals."""

    peak_bytes: int
    """Peak of live tensor bytes (parameters, gradients, optimizer state, saved activations, temporaries, inputs)."""
    allocator_peak_bytes: int | None
    """The peak of the CUDA caching allocator's blocks (`max_memory_allocated()`): each request rounded to 512
    bytes, and a large block's rest of 1 MiB or less kept with it (device/cuda_allocator.py); CUDA only."""
    activation_bytes: int
    """Saved for backward and alive when backward begins, each storage once, model state excluded."""
    parameter_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    input_bytes: int
    optimizer_bytes: int
    """The optimizer's state (0 without one)."""
    peak_at: PeakAt
    at_peak: dict[str, int]
    """What is live at the peak: parameters, buffers, inputs, gradients, optimizer_state, saved_activations, other;
    and communication where the step keeps buffers to reduce gradients in (DDP's buckets)."""
    forward_flops: int
    recompute_flops: int
    peak_bytes_min: int | None = None
    """Where shapes follow values the weights decide: the lowest peak over the assumptions' range; else None."""
    peak_bytes_max: int | None = None
    forward_seconds: float = 0.0
    """The roofline time of forward on the target (device/roofline.py): each op's FLOPs or bytes, whichever binds."""
    recompute_seconds: float = 0.0
    """The same for what reruns in backward (a plan's checkpointed modules)."""
    reserved_peak_bytes: int | None = None
    """The peak of the allocator's segments (`max_memory_reserved()`) over two steps from a fresh allocator
    (device/allocator_replay.py); CUDA only. The CUDA context and cuBLAS's workspaces are not in it
    (device/cuda_runtime.py)."""


@dataclass(frozen=True)
class ModuleFacts:
    """One module over the whole step (all its calls)."""

    path: str
    class_name: str
    calls: int
    saved_bytes: int
    """Storages autograd saved while the module ran (inside calls included), alive when backward begins."""
    output_bytes: int
    input_bytes: int
    forward_flops: int
    uses_randomness: bool
    moves_device: bool
    reads_outside_state: bool
    mutates_buffers: bool
    mutates_inputs: bool = False
    """Writes in place into a tensor it received (a call inside it included)."""
    changes_state: str | None = None
    """Which plain Python attribute of it, or of a module inside it, forward changed (`self.calls: 0 -> 1`)."""
    forward_seconds: float = 0.0
    """The roofline time of its forward (inside calls included), on the target: what checkpointing it reruns."""


def live_curve(trace: Trace, block: int = 1) -> np.ndarray:
    """Live bytes after each event: curve[e] for e in 0..trace.events."""
    import numpy as np

    nbytes = np.fromiter((s.nbytes for s in trace.storages), dtype=np.int64, count=len(trace.storages))
    if block > 1:
        nbytes = -(-nbytes // block) * block
    born = np.fromiter((s.born for s in trace.storages), dtype=np.int64, count=len(trace.storages))
    died = np.fromiter(
        (trace.events + 1 if s.died is None else s.died for s in trace.storages), dtype=np.int64,
        count=len(trace.storages),
    )
    delta = np.zeros(trace.events + 2, dtype=np.int64)
    np.add.at(delta, born, nbytes)
    np.add.at(delta, died, -nbytes)
    return np.cumsum(delta)[: trace.events + 1]


def alive_at(trace: Trace, event: int) -> list[int]:
    """Indexes of the storages alive right after `event`."""
    return [i for i, s in enumerate(trace.storages) if s.born <= event and (s.died is None or s.died > event)]


def summarize(trace: Trace, cuda: bool = False) -> Summary:
    """The summary of a trace; `cuda` adds the CUDA caching allocator's allocated and reserved peaks."""
    import numpy as np

    curve = live_curve(trace)
    allocator = allocator_peaks(trace) if cuda else None
    peak_event = int(np.argmax(curve)) if len(curve) else 0
    by_born = {s.born: s for s in trace.storages}
    at = by_born.get(peak_event)
    call = trace.calls[at.call] if at is not None and at.call is not None else None
    peak_at = PeakAt(
        module=call.path if call is not None else None,
        class_name=call.class_name if call is not None else None,
        phase=at.phase.value if at is not None else Phase.SETUP.value,
    )
    breakdown = dict.fromkeys(
        ("parameters", "buffers", "inputs", "gradients", "optimizer_state", "saved_activations", "other"), 0
    )
    for index in alive_at(trace, peak_event):
        storage = trace.storages[index]
        category = _category(storage.kind, storage.saved)
        breakdown[category] = breakdown.get(category, 0) + storage.nbytes  # "communication" only where there is some

    def total(kind: StorageKind) -> int:
        return sum(s.nbytes for s in trace.storages if s.kind is kind)

    return Summary(
        peak_bytes=int(curve[peak_event]) if len(curve) else 0,
        allocator_peak_bytes=allocator.allocated_bytes if allocator is not None else None,
        activation_bytes=sum(s.nbytes for s in trace.storages if s.saved),
        parameter_bytes=total(StorageKind.PARAMETER),
        buffer_bytes=total(StorageKind.BUFFER),
        gradient_bytes=sum(s.nbytes for s in trace.storages if s.kind is StorageKind.GRADIENT and s.died is None),
        input_bytes=total(StorageKind.INPUT),
        optimizer_bytes=total(StorageKind.OPTIMIZER),
        peak_at=peak_at,
        at_peak=breakdown,
        forward_flops=sum(c.flops for c in trace.calls if not c.recompute),
        recompute_flops=trace.recompute_flops,
        forward_seconds=sum(c.seconds for c in trace.calls if not c.recompute),
        recompute_seconds=trace.recompute_seconds,
        reserved_peak_bytes=allocator.reserved_bytes if allocator is not None else None,
    )


def _category(kind: StorageKind, saved: bool) -> str:
    if kind is StorageKind.PARAMETER:
        return "parameters"
    if kind is StorageKind.BUFFER:
        return "buffers"
    if kind is StorageKind.INPUT:
        return "inputs"
    if kind is StorageKind.GRADIENT:
        return "gradients"
    if kind is StorageKind.OPTIMIZER:
        return "optimizer_state"
    if kind is StorageKind.COMMUNICATION:
        return "communication"
    return "saved_activations" if saved else "other"


def subtree_calls(trace: Trace) -> dict[int, list[int]]:
    """call id -> ids of the forward calls inside it, itself included."""
    inside: dict[int, list[int]] = {c.id: [c.id] for c in trace.calls if not c.recompute}
    for call in reversed(trace.calls):
        if call.recompute or call.parent is None or call.parent not in inside:
            continue
        inside[call.parent].extend(inside[call.id])
    return inside


def module_facts(trace: Trace) -> tuple[ModuleFacts, ...]:
    """Per-module facts, in the model's definition order, for every module that ran in forward."""
    storages = trace.storages
    inside = subtree_calls(trace)
    calls_by_path: dict[str, list[ModuleCall]] = {}
    for call in trace.calls:
        if not call.recompute:
            calls_by_path.setdefault(call.path, []).append(call)
    changed = dict(trace.state_changes)
    facts = []
    for info in trace.modules:
        calls = calls_by_path.get(info.path)
        if not calls:
            continue
        members = [trace.calls[i] for call in calls for i in inside[call.id]]
        saved = {i for member in members for i in member.saved_storages if storages[i].saved}
        facts.append(
            ModuleFacts(
                path=info.path,
                class_name=info.class_name,
                calls=len(calls),
                saved_bytes=sum(storages[i].nbytes for i in saved),
                output_bytes=sum(storages[i].nbytes for call in calls for i in call.output_storages),
                input_bytes=sum(storages[i].nbytes for call in calls for i in call.input_storages),
                forward_flops=sum(member.flops for member in members),
                forward_seconds=sum(member.seconds for member in members),
                uses_randomness=any(m.uses_randomness for m in members),
                moves_device=any(m.moves_device for m in members),
                reads_outside_state=any(m.reads_outside_state for m in members),
                mutates_buffers=any(m.mutates_buffers for m in members),
                mutates_inputs=any(m.mutates_inputs for m in calls),
                changes_state=next(
                    (f"{path or 'the model'}: {what}" for path, what in changed.items()
                     if path == info.path or info.path == "" or path.startswith(info.path + ".")),
                    None,
                ),
            )
        )
    return tuple(facts)
