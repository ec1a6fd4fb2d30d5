"""A traced step as a CUDA memory snapshot: what `torch.cuda.memory._snapshot()` returns, for PyTorch's own viewers.

`torch.cuda.memory._record_memory_history()` followed by `_snapshot()` gives a dict
that `torch.cuda.memory._dump_snapshot` pickles, and that `python -m
torch.cuda._memory_viz` (stats, trace, trace_plot, segment_plot, memory, segments)
and https://pytorch.org/memory_viz read. It holds:

- `device_traces`: per device, the allocator's events in order, each a dict with
  `action` (`segment_alloc`, `alloc`, `free_requested`, `free_completed`), `addr`,
  `size`, `stream`, `frames` and `time_us`. An `alloc` records the size requested,
  not the block's (`record_trace(TraceEntry::ALLOC, ptr, orig_size, ...)` in
  `CUDACachingAllocator.cpp`); a `segment_alloc` the segment's `cudaMalloc`.
- `segments`: the allocator's state at the end: each segment's address, `total_size`,
  `allocated_size`, `active_size`, `requested_size`, pool (`segment_type`) and its
  `blocks` in address order, each `active_allocated` or `inactive` with its `size`
  and `requested_size`.

Here the events are the ones `allocator_replay.py` replays through the allocator model,
two steps from a fresh allocator (the state first, then each step's allocations and
frees, with the step's leftovers freed between steps), so replaying the snapshot's
events through the model gives the report's allocated and reserved peaks, and its
requested sizes the peak of live tensors. A snapshot has no frames of Python or C++
here: each event's frames are the module calls that allocated its storage, innermost
first (`model.layers.0.self_attn`, named by its class), then the step and the phase
(forward, loss, backward, recompute, optimizer; setup for the state made before the
step). `time_us` is the event's number in the replay, not a time.
"""

from __future__ import annotations

from typing import Any

from memlayout.activations.device.allocator_replay import STEPS, step_events
from memlayout.activations.device.cuda_allocator import FREE, CachingAllocator
from memlayout.activations.facts import Trace

Frame = dict[str, Any]

STEP_FILE = "memlayout: predicted step"
"""The outermost frame's `filename`: what made the event."""
ALLOCATOR_SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
    "expandable_segments": False, "roundup_power2_divisions": {str(1 << power): 0 for power in range(16)},
}
"""`allocator_settings` as `_snapshot()` reports the defaults, which the allocator model follows (cuda_allocator.py):
no max_split_size, no expandable segments, no power-of-two rounding."""


def memory_snapshot(trace: Trace, steps: int = STEPS) -> dict[str, Any]:
    """The traced step, replayed `steps` times from a fresh allocator, as `torch.cuda.memory._snapshot()`'s dict.

    Args:
        trace: A traced step (any device: the layout is the CUDA caching allocator model's).
        steps: Steps replayed, as `allocator_peaks` replays them (its reserved peak is reached in the second).

    Returns:
        {"segments": [...], "device_traces": [[...]], "allocator_settings": {...}, "external_annotations": []}:
        one device, its events and its segments at the end, and the allocator's settings (the defaults).
    """
    allocator = CachingAllocator()
    count = max(len(trace.storages), 1)
    frames_of: dict[int, list[Frame]] = {}
    live: dict[int, tuple[int, int, list[Frame]]] = {}
    """storage id -> (address, size requested, frames)."""
    events: list[dict[str, Any]] = []
    for number, (storage_id, nbytes) in enumerate(step_events(trace, steps)):
        if nbytes == FREE:
            held = live.pop(storage_id, None)
            if held is None:  # a storage of 0 bytes: the allocator made nothing to free
                continue
            address, requested, frames = held
            allocator.free(address)
            for action in ("free_requested", "free_completed"):
                events.append(_event(action, address, requested, frames, number))
            continue
        index, step = storage_id % count, storage_id // count
        frames = frames_of.setdefault(storage_id, _frames(trace, index, step))
        segments_before = len(allocator.segment_log)
        made = allocator.malloc(nbytes)
        if made is None:  # 0 bytes: torch's allocator allocates nothing, and records nothing
            continue
        address = made
        for segment_address, size in allocator.segment_log[segments_before:]:
            events.append(_event("segment_alloc", segment_address, size, frames, number))
        events.append(_event("alloc", address, nbytes, frames, number))
        live[storage_id] = (address, nbytes, frames)
    by_address = {address: (requested, frames) for address, requested, frames in live.values()}
    return {"segments": _segments(allocator, by_address), "device_traces": [events],
            "allocator_settings": ALLOCATOR_SETTINGS, "external_annotations": []}


def _event(action: str, address: int, size: int, frames: list[Frame], number: int) -> dict[str, Any]:
    return {"action": action, "addr": address, "size": size, "stream": 0, "frames": frames, "time_us": number,
            "compile_context": "N/A", "user_metadata": ""}


def _frames(trace: Trace, index: int, step: int) -> list[Frame]:
    """The module calls that allocated a storage, innermost first, then the step and its phase."""
    storage = trace.storages[index]
    frames: list[Frame] = []
    call_id = storage.call
    while call_id is not None:
        call = trace.calls[call_id]
        what = "rerun of forward" if call.recompute else f"{storage.phase.value} of"
        frames.append({"filename": call.path or "the model", "line": call.id, "name": f"{what} {call.class_name}"})
        call_id = call.parent
    frames.append({"filename": STEP_FILE, "line": step + 1, "name": f"step {step + 1}: {storage.phase.value}"})
    return frames


def _segments(allocator: CachingAllocator, live: dict[int, tuple[int, list[Frame]]]) -> list[dict[str, Any]]:
    """The allocator's segments at the end, as `_snapshot()`'s `segments`: each block allocated or free."""
    segments = []
    for address, total, small, blocks in allocator.segment_blocks():
        shown: list[dict[str, Any]] = []
        allocated_size = requested_size = 0
        for block_address, size, allocated in blocks:
            requested, frames = live.get(block_address, (0, [])) if allocated else (0, [])
            shown.append({"address": block_address, "size": size, "requested_size": requested,
                          "state": "active_allocated" if allocated else "inactive", "frames": frames})
            allocated_size += size if allocated else 0
            requested_size += requested
        segments.append({
            "device": 0, "address": address, "total_size": total, "allocated_size": allocated_size,
            "active_size": allocated_size, "requested_size": requested_size,
            "stream": 0, "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": shown[0]["frames"] if shown else [], "blocks": shown,
        })
    return segments
