"""Frozen facts of one traced training step: storage lifetimes and module calls.

A trace is a sequence of events: each storage's allocation and its release is
one event, numbered from 1. Everything else (the peak, what is saved for
backward, what a module costs) is derived from these records, so the planner
and the reporters work on plain data, never on live tensors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class StorageKind(str, enum.Enum):
    """What a storage holds."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"
    GRADIENT = "gradient"
    """A parameter's `.grad` at the end of the step."""
    OPTIMIZER = "optimizer"
    """The optimizer's state (AdamW's moments, its step counts): kept from one step to the next."""
    COMMUNICATION = "communication"
    """A buffer a data-parallel wrapper keeps between steps to reduce gradients in (DDP's buckets)."""
    STEP = "step"
    """Created during the step: activations and temporaries."""
    OTHER = "other"
    """Existed before the step and is not model state or an input (a tensor a module keeps in a plain attribute)."""


class Phase(str, enum.Enum):
    """When an event happened."""

    SETUP = "setup"
    """Before the step: model state and inputs."""
    FORWARD = "forward"
    LOSS = "loss"
    """After the model returned, while the loss is computed."""
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    """A checkpointed module running its forward again during backward."""
    OPTIMIZER = "optimizer"
    """`optimizer.step()`, after backward."""


@dataclass(frozen=True)
class StorageLife:
    """One storage: its size and the events of its allocation and release."""

    nbytes: int
    kind: StorageKind
    born: int
    died: int | None
    """None when it is still alive at the end of the step."""
    call: int | None
    """The innermost module call that allocated it (ModuleCall.id); None outside any module."""
    phase: Phase
    saved: bool
    """Saved for backward during forward, and still alive when backward starts."""


@dataclass(frozen=True)
class ModuleCall:
    """One call of a module's forward (modules called in a loop have several)."""

    id: int
    path: str
    """Dotted path from the model (`transformer.h.0.attn`); "" is the model itself."""
    class_name: str
    parent: int | None
    recompute: bool
    """A rerun of a checkpointed module during backward."""
    start: int
    """Event number when the call began; storages it allocates have `born` in (start, end]."""
    end: int
    backward_start: int | None
    """Event number just before the first backward op of this call or any call inside it."""
    input_storages: tuple[int, ...]
    """Indexes into Trace.storages."""
    output_storages: tuple[int, ...]
    saved_storages: tuple[int, ...]
    """Storages autograd saved while this call (not a call inside it) ran, model state excluded."""
    flops: int
    """Forward FLOPs of ops run directly in this call (calls inside it not included)."""
    uses_randomness: bool
    moves_device: bool
    reads_outside_state: bool
    mutates_buffers: bool
    mutates_inputs: bool = False
    """Writes in place into a tensor it received: a rerun would start from the changed values."""
    seconds: float = 0.0
    """The roofline time of the ops run directly in this call, on the target (device/roofline.py): each op's FLOPs
    or the bytes it moves, whichever binds; 0 where the trace was not priced."""


@dataclass(frozen=True)
class ModuleInfo:
    """A module of the model, whether or not it ran."""

    path: str
    class_name: str
    sequential_children: tuple[str, ...] | None
    """The child paths of an nn.Sequential (what checkpoint_sequential splits); None otherwise."""


@dataclass(frozen=True)
class GenerationTrace:
    """What a generate step's trace adds (step/generate.py): its forwards and its key/value cache."""

    forwards: tuple[tuple[int, int], ...]
    """(first event, last event) of each forward of the model itself: the prompt's (the prefill), then one a
    generated token but the last, whose logits choose it and need no forward after."""
    cache_storages: tuple[int, ...]
    """Every storage the cache held at the end of some forward (Trace.storages indexes): a dynamic cache's
    keys and values, each step's longer than the last, or a static cache's, allocated once."""
    final_cache: tuple[int, ...]
    """The storages the cache held after the last forward: the key/value cache at the end."""


@dataclass(frozen=True)
class Trace:
    """Everything recorded about one step."""

    storages: tuple[StorageLife, ...]
    calls: tuple[ModuleCall, ...]
    modules: tuple[ModuleInfo, ...]
    """Every module of the model, in definition order."""
    events: int
    forward_end: int
    """The last event before backward began."""
    loss: str
    """How the loss was picked (see step/run.py)."""
    recompute_flops: int
    device: str
    mode: str
    """fake, meta or real."""
    notes: tuple[str, ...]
    fallbacks: tuple[tuple[str, int], ...] = ()
    assumptions: tuple[tuple[str, str, int], ...] = ()
    """(op, kind, calls) for each op whose output's shape or indices followed an assumption, not values
    (kind: "routing" or "mask"; see fake_step.ASSUMPTIONS)."""
    state_changes: tuple[tuple[str, str], ...] = ()
    """(module path, what changed) for each module whose plain Python state (a counter, a cache's length)
    differs between the start and the end of forward: a checkpointed rerun would see the changed state."""
    rerun_state_differs: tuple[tuple[str, str], ...] = ()
    """(module path, what differs) for each module whose rerun in backward started from other attributes than
    any of its calls in forward did (a tensor forward left on `self`, a counter): the rerun is no replay."""
    """(op, calls) for each op whose fake kernel refused and whose real kernel stood in (see trace/fake_step.py)."""
    generation: GenerationTrace | None = None
    """A generate step's forwards and cache; None for other steps."""
    recompute_seconds: float = 0.0
    """The roofline time of the ops rerun during backward, on the target (0 when not priced)."""
    rng_state_bytes: int = 0
    """The generator state `torch.utils.checkpoint` keeps for each checkpointed call, where this step's device
    holds it: `torch.get_rng_state()`'s bytes on the CPU, 0 on a GPU (host memory). See trace/tracer.py."""
