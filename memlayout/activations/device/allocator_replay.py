"""A traced step's allocations and frees, replayed through the CUDA caching allocator model (cuda_allocator.py).

A trace numbers every storage's allocation and release (facts.StorageLife's `born` and
`died`), which is the order the allocator sees them in. Two things about training
decide what `max_memory_reserved()` reads besides that order:

- segments stay reserved from one step to the next (the allocator releases none unless
  a cudaMalloc fails), so the reserved peak of a run is the largest the segments grow
  over its steps; the step is replayed `steps` times (2 by default: on an H200 the
  second step of a 1.1B Llama reserved 570 MiB of segments more than the first had,
  while the model, replaying that step from nothing, reached its reserved peak in the
  first replay and grew no more in a second or third);
- between steps, what the step made and still holds is freed (the gradients, by
  `zero_grad(set_to_none=True)`, torch's default), and the model's state stays:
  parameters, buffers, the optimizer's state, the inputs.

The state that exists before the step is allocated first, in the trace's order: the
order a model built on the device allocates it in.
"""

from __future__ import annotations

from memlayout.activations.device.cuda_allocator import FREE, AllocatorPeaks, Event, replay
from memlayout.activations.facts import Phase, StorageKind, Trace

STEPS = 2
"""Steps replayed: the reserved peak of a run is reached by its second step in the traces measured."""
_KEPT_BETWEEN_STEPS = frozenset({StorageKind.PARAMETER, StorageKind.BUFFER, StorageKind.OPTIMIZER, StorageKind.INPUT})


def step_events(trace: Trace, steps: int = STEPS) -> list[Event]:
    """The allocation and free events of `steps` training steps built from one traced step.

    Args:
        trace: The traced step.
        steps: How many steps to replay; the first starts from the state before the step.

    Returns:
        (storage id, nbytes) for an allocation and (storage id, FREE) for a free, in order.
        A storage of a later step has the id of the trace's storage plus a multiple of
        the number of storages, so each id names one allocation at a time.
    """
    order: list[tuple[int, int, bool]] = []  # (event number, storage index, allocates?)
    for index, storage in enumerate(trace.storages):
        order.append((storage.born, index, True))
        if storage.died is not None:
            order.append((storage.died, index, False))
    order.sort()
    count = len(trace.storages)
    repeated = {index for index, s in enumerate(trace.storages)
                if s.phase is not Phase.SETUP and s.kind not in _KEPT_BETWEEN_STEPS}
    events: list[Event] = []
    for step in range(steps):
        offset = step * count
        for _, index, allocates in order:
            if step and index not in repeated:
                continue
            events.append((offset + index, trace.storages[index].nbytes if allocates else FREE))
        if step + 1 < steps:
            # zero_grad(set_to_none=True) and the step's own leftovers: what the next step makes again.
            events.extend((offset + index, FREE) for index in sorted(repeated) if trace.storages[index].died is None)
    return events


def allocator_peaks(trace: Trace, steps: int = STEPS) -> AllocatorPeaks:
    """What `torch.cuda.max_memory_allocated()` and `max_memory_reserved()` would read over `steps` steps of
    the traced one, from a fresh allocator: the CUDA caching allocator's model replays the trace's storages.

    Any trace can be replayed, whatever device it was traced for; the figures are CUDA's.
    What the CUDA runtime allocates outside the trace (cuBLAS's workspaces, see
    cuda_runtime.py) is not in them.
    """
    return replay(step_events(trace, steps))
