"""Replaying a real CUDA allocator history (`torch.cuda.memory._snapshot()`) through memlayout's allocator model.

The snapshot holds the segments and blocks at its end, and the trace entries recorded
since `_record_memory_history`: `alloc` (address, requested size), `free_requested`
and `free_completed`, `segment_alloc`. The allocator's state when recording began is
the end state with the trace undone, which is what `start_state` rebuilds; the model
then replays the trace from there (`replay_from_start`) or from nothing
(`replay_cold`).
"""

from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memlayout.activations.device.cuda_allocator import (
    FREE,
    SMALL_SIZE,
    AllocatorPeaks,
    CachingAllocator,
    Event,
    replay,
    round_size,
)

H200_HISTORY = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu"
                / "llama1b-autocast-allocator-history-h200.pickle.gz")
"""The second AdamW step of a 1.1B Llama under bf16 autocast, 1x2048 tokens, on an H200
(torch 2.11.0+cu130), recorded by benchmarks/gpu/gpu_probe.py."""
H200_MEASURED = {"max_memory_allocated": 22152553984, "max_memory_reserved": 26730299392,
                 "allocated_before_step": 13318809088, "reserved_before_step": 26132611072}
"""`torch.cuda.memory_stats` around that step, from benchmarks/results/gpu/probe-h200.json
(steps, "llama-1B 1x2048", "autocast-bf16"): peaks reset just before the step."""


class _PlainData(pickle.Unpickler):
    """A snapshot is dicts, lists and numbers: any global in the pickle is refused, nothing is imported."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"an allocator snapshot names no globals, and this one names {module}.{name}")


def load_snapshot(path: Path = H200_HISTORY) -> dict[str, Any]:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    snapshot: dict[str, Any] = _PlainData(io.BytesIO(data)).load()
    return snapshot


@dataclass(frozen=True)
class Segment:
    address: int
    size: int
    small: bool
    allocated: tuple[tuple[int, int], ...]
    """(address, block size) of the blocks in use."""


@dataclass(frozen=True)
class History:
    start_segments: tuple[Segment, ...]
    """The segments when recording began, with the blocks then in use."""
    start_requests: dict[int, int]
    """Address -> requested bytes of each block in use when recording began."""
    trace: tuple[tuple[str, int, int], ...]
    """(action, address, size) of alloc, free_completed and segment_alloc, in order."""
    new_segments: tuple[tuple[int, int], ...]
    """(address, size) of each segment_alloc, in order."""


def history(snapshot: dict[str, Any]) -> History:
    """The allocator's state when recording began, and what happened after."""
    (entries,) = snapshot["device_traces"]
    if snapshot["allocator_settings"].get("expandable_segments") or snapshot["allocator_settings"].get(
            "max_split_size", -1) != -1:
        raise ValueError("the model follows the default settings; this snapshot changed them")
    trace = tuple((e["action"], e["addr"], e["size"]) for e in entries
                  if e["action"] in ("alloc", "free_completed", "segment_alloc"))
    if any(e["action"] in ("segment_free", "segment_map", "segment_unmap", "oom") for e in entries):
        raise ValueError("the trace releases or maps segments; the model replays a step that keeps them")
    new_segments = tuple((address, size) for action, address, size in trace if action == "segment_alloc")
    grown = {address for address, _ in new_segments}
    end_blocks: dict[int, tuple[int, int]] = {}  # address -> (block size, requested size)
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                end_blocks[block["address"]] = (block["size"], block["requested_size"])
    # Undo the trace, last entry first: a block allocated in it was not there before; a block freed
    # in it and not allocated in it was there from the start.
    live: dict[int, int] = {a: requested for a, (_, requested) in end_blocks.items()}
    for action, address, size in reversed(trace):
        if action == "alloc":
            del live[address]
        elif action == "free_completed":
            live[address] = size
    segments = []
    for segment in snapshot["segments"]:
        if segment["address"] in grown:
            continue
        start, total = segment["address"], segment["total_size"]
        small = segment["segment_type"] == "small"
        inside = sorted(a for a in live if start <= a < start + total)
        blocks = []
        for i, address in enumerate(inside):
            following = inside[i + 1] if i + 1 < len(inside) else start + total
            if address in end_blocks and end_blocks[address][1] == live[address]:
                size = end_blocks[address][0]
            else:
                # A large-pool block keeps the rest of what it was cut from when that rest is at most
                # 1 MiB (should_split), and a free large-pool block is always larger than 1 MiB: a gap
                # of at most 1 MiB behind a block is the block's own.
                size = round_size(live[address])
                gap = following - address - size
                if not small and 0 < gap <= SMALL_SIZE:
                    size += gap
            blocks.append((address, size))
        segments.append(Segment(start, total, small, tuple(blocks)))
    return History(tuple(segments), live, trace, new_segments)


@dataclass(frozen=True)
class SeededReplay:
    peaks: AllocatorPeaks
    allocated_at_start: int
    reserved_at_start: int
    placements: int
    """Allocations in the trace."""
    misplaced: int
    """Allocations the model put at another address than CUDA did."""
    new_segments: tuple[tuple[int, int], ...]
    """(address, size) of each segment the model asked the driver for."""


def replay_from_start(h: History) -> SeededReplay:
    """Seed the model with the state when recording began and replay the trace; count where it placed each block
    against where CUDA did."""
    allocator = CachingAllocator(segment_addresses=[address for address, _ in h.new_segments])
    for segment in h.start_segments:
        allocator.seed_segment(segment.address, segment.size, segment.small, segment.allocated)
    allocated_at_start, reserved_at_start = allocator.allocated, allocator.reserved
    allocator.reset_peaks()
    where: dict[int, int] = {a: a for a in h.start_requests}  # CUDA's address -> the model's
    placements = misplaced = 0
    for action, address, size in h.trace:
        if action == "alloc":
            placed = allocator.malloc(size)
            assert placed is not None
            placements += 1
            misplaced += placed != address
            where[address] = placed
        elif action == "free_completed":
            allocator.free(where.pop(address))
    return SeededReplay(allocator.peaks(), allocated_at_start, reserved_at_start, placements, misplaced,
                        tuple(allocator.segment_log))


def cold_events(h: History, steps: int = 2) -> list[Event]:
    """The events a prediction from nothing would replay: the blocks in use when recording began (in address order,
    for want of their allocation order), then the step `steps` times. Each address names one storage at a time."""
    events: list[Event] = []
    names: dict[int, int] = {}
    counter = 0

    def allocate(address: int, nbytes: int) -> None:
        nonlocal counter
        counter += 1
        names[address] = counter
        events.append((counter, nbytes))

    for address in sorted(h.start_requests):
        allocate(address, h.start_requests[address])
    for _ in range(steps):
        for action, address, size in h.trace:
            if action == "alloc":
                allocate(address, size)
            elif action == "free_completed":
                events.append((names.pop(address), FREE))
    return events


def replay_cold(h: History, steps: int = 2) -> AllocatorPeaks:
    return replay(cold_events(h, steps))
