"""The tracer's mutable records: one per storage and one per module call, frozen into facts when the step ends.

StepTracer (tracer.py) fills them while the step runs; `StepTracer.freeze` turns them into
the frozen `StorageLife` and `ModuleCall` of facts.py.
"""

from __future__ import annotations

from typing import Any

from memlayout.activations.facts import Phase, StorageKind


class StorageRecord:
    """Mutable record while tracing; frozen into a StorageLife at the end."""

    __slots__ = ("born", "call", "died", "kind", "nbytes", "phase", "ref", "storage_nbytes")

    def __init__(
        self, nbytes: int, storage_nbytes: int, kind: StorageKind, born: int, call: int | None, phase: Phase
    ) -> None:
        self.nbytes = nbytes
        self.storage_nbytes = storage_nbytes
        """What the storage itself reports; differs from nbytes where a kernel correction applies."""
        self.kind = kind
        self.born = born
        self.died: int | None = None
        self.call = call
        self.phase = phase
        self.ref: Any = None


class CallRecord:
    """Mutable record of one module call while tracing; frozen into a ModuleCall at the end."""

    __slots__ = (
        "backward_start", "class_name", "end", "flops", "id", "inputs", "module", "moves_device", "mutates_buffers",
        "mutates_inputs", "outputs", "parent", "path", "reads_outside_state", "recompute", "saved", "seconds", "start",
        "uses_randomness",
    )

    def __init__(self, call_id: int, module: Any, path: str, parent: int | None, recompute: bool, start: int) -> None:
        self.id = call_id
        self.module = module
        self.path = path
        self.class_name = type(module).__name__
        self.parent = parent
        self.recompute = recompute
        self.start = start
        self.end = start
        self.backward_start: int | None = None
        self.inputs: tuple[int, ...] = ()
        self.outputs: tuple[int, ...] = ()
        self.saved: list[int] = []
        self.flops = 0
        self.seconds = 0.0
        self.uses_randomness = False
        self.moves_device = False
        self.reads_outside_state = False
        self.mutates_buffers = False
        self.mutates_inputs = False
