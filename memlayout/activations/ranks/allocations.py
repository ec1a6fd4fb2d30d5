"""One rank's allocations and frees, in order and by stream, for the CUDA caching allocator's model.

FSDPMemTracker counts a rank's live tensor bytes: it adds a storage when an op makes it
(or the tracker meets it as a parameter, buffer, optimizer state or input), takes it
away when the storage dies, and changes it when FSDP2 resizes a storage in place
(unsharded parameters are allocated by `storage.resize_(n)` and freed by
`resize_(0)`). Every such change goes through its `_update_snap`; `AllocationLog`
records each as the allocator would see it: an allocation of the storage's bytes on
the stream current when it was made, or a free. A resize is both: the new block is
allocated, then the old one freed, as `StorageImpl` resizing does on CUDA.

Streams matter because the allocator keeps a pool per stream (device/cuda_allocator.py).
FSDP2 makes its all-gather input and output on its all-gather copy-in stream, runs the
all-gather on the all-gather stream, makes each reduce-scatter's output on its
reduce-scatter stream and the reduce-scatter's input on the default stream
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, `foreach_all_gather` and
`foreach_reduce`); the current stream at each allocation says which, on CUDA and on the
CPU alike (`torch.cpu.stream` sets `torch.cpu.current_stream()`).

`reserved_peaks` replays the log through the allocator model: the state before the step
(parameters, buffers, the optimizer's state, the inputs) first, then the steady-state
step `STEPS` times, as allocator_replay.py does for one device.
"""

from __future__ import annotations

import functools
from typing import Any

from memlayout import _torch
from memlayout.activations.device.allocator_replay import STEPS
from memlayout.activations.device.cuda_allocator import FREE, AllocatorPeaks, StreamEvent, replay
from memlayout.activations.device.expandable_segments import ExpandableAllocator
from memlayout.activations.ranks.facts import RankReserved

DEFAULT_STREAM = "default"
STREAM_NAMES = {
    "all_gather_copy_in_stream": "all-gather copy-in",
    "all_gather_stream": "all-gather",
    "reduce_scatter_stream": "reduce-scatter",
    "all_reduce_stream": "all-reduce",
}
"""FSDP2's streams (`FSDPCommContext`'s attributes), as the report names them."""


class AllocationLog:
    """The allocations and frees a recording tracker saw, in order: (serial, bytes or FREE, stream)."""

    def __init__(self, device_type: str) -> None:
        import torch

        self.events: list[StreamEvent] = []
        self.step_start = 0
        """Events before this index are the state the step starts from."""
        self._device = torch.get_device_module(device_type)
        self._streams: dict[Any, int] = {self._key(self._device.current_stream()): 0}
        self.stream_names: dict[int, str] = {0: DEFAULT_STREAM}
        self._serials: dict[int, int] = {}
        self._next = 0

    @staticmethod
    def _key(stream: Any) -> Any:
        # torch.cuda.current_stream() makes a new Python object for the same stream each call; its id is stable.
        stream_id = getattr(stream, "stream_id", None)
        return ("cuda", stream_id) if isinstance(stream_id, int) else id(stream)

    def mark_step(self) -> None:
        """The step starts here: what was allocated so far is its starting state."""
        self.step_start = len(self.events)

    def name_streams(self, model: Any) -> None:
        """Name FSDP2's streams, once its root state has made them (after the first step)."""
        state = getattr(model, "_get_fsdp_state", None)
        comm = getattr(state(), "_comm_ctx", None) if state is not None else None
        for attribute, name in STREAM_NAMES.items():
            stream = getattr(comm, attribute, None)
            if stream is not None:
                index = self._streams.setdefault(self._key(stream), len(self._streams))
                self.stream_names[index] = name

    def allocate(self, owner: Any, nbytes: int) -> None:
        if nbytes <= 0:
            return
        serial = self._next
        self._next += 1
        self._serials[id(owner)] = serial
        stream = self._streams.setdefault(self._key(self._device.current_stream()), len(self._streams))
        self.events.append((serial, nbytes, stream))

    def free(self, owner: Any) -> None:
        serial = self._serials.pop(id(owner), None)
        if serial is not None:
            self.events.append((serial, FREE, 0))

    def resize(self, owner: Any, nbytes: int) -> None:
        """A storage resized in place: on CUDA the new block is allocated before the old one is freed (the copy
        between them needs both)."""
        old = self._serials.pop(id(owner), None)
        self.allocate(owner, nbytes)
        if old is not None:
            self.events.append((old, FREE, 0))

    def reserved(self, steps: int = STEPS, *, expandable: bool = False) -> RankReserved:
        """Replay the state, then the step `steps` times (see the module's docstring); `expandable`: with
        expandable segments (device/expandable_segments.py)."""
        state, step = self.events[:self.step_start], self.events[self.step_start:]
        state_serials = {serial for serial, _, _ in state}
        alive_at_end: dict[int, None] = {}
        for serial, nbytes, _ in step:
            if serial in state_serials:
                continue
            if nbytes == FREE:
                alive_at_end.pop(serial, None)
            else:
                alive_at_end[serial] = None
        events: list[StreamEvent] = list(state)
        span = self._next
        for number in range(steps):
            offset = number * span
            events.extend((serial + offset, nbytes, stream) for serial, nbytes, stream in step
                          if not (number and serial in state_serials))
            if number + 1 < steps:
                # zero_grad(set_to_none=True) and the step's own leftovers: what the next step makes again.
                events.extend((serial + offset, FREE, 0) for serial in alive_at_end)
        peaks: AllocatorPeaks = replay(events, allocator=ExpandableAllocator() if expandable else None)
        return RankReserved(
            allocated_bytes=peaks.allocated_bytes,
            reserved_bytes=peaks.reserved_bytes,
            reserved_by_stream=tuple((self.stream_names.get(stream, f"stream {stream}"), size)
                                     for stream, size in peaks.reserved_by_stream),
            events=len(step),
        )


def recording_tracker(model: Any, optimizer: Any, log: AllocationLog) -> Any:
    """torch's FSDPMemTracker over `model` and `optimizer`, recording every change of its count into `log`."""
    return _recording_class()(model, optimizer, log)


@functools.cache
def _recording_class() -> type:
    update_type: Any = _torch.MemTrackerUpdateType
    tracker: Any = _torch.FSDPMemTracker  # typed in some torch releases, not in others

    class RecordingTracker(tracker):  # type: ignore[misc]
        def __init__(self, model: Any, optimizer: Any, log: AllocationLog) -> None:
            super().__init__(model, optimizer)
            self._memlayout_log = log

        def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: int | None = None,
                         old_reftype: Any = None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            log = self._memlayout_log
            if u_type == update_type.ADD:
                log.allocate(winfo, winfo.size * winfo.element_size)
            elif u_type == update_type.DEL:
                log.free(winfo)
            elif u_type == update_type.SIZE:
                log.resize(winfo, winfo.size * winfo.element_size)

    return RecordingTracker
