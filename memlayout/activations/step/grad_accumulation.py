"""Where autograd sums two gradients for one input in place, as a step with no dispatch mode does.

torch's engine collects the gradients bound for each input of a node in an InputBuffer
and sums a later one into the first (torch/csrc/autograd/input_buffer.cpp, `accumulate`):
in place, `old.add_(new)`, when the first is a plain dense tensor that the buffer alone
holds, storage included (`can_accumulate_inplace`), and neither is "subclass-like";
otherwise out of place, `old + new`, which allocates the sum. `at::isTensorSubclassLike`
is true of every tensor while any Python dispatch mode is active, and fake tensors are
subclasses: a traced step always takes the out-of-place branch, and allocates sums the
user's step does not. On a real CPU step of transformers' MambaForCausalLM (the zoo's
small size, whose selective scan sums a 1 MiB gradient for each of its slices), the
step peaks at 11,423,328 bytes by the CPU allocator's events with no mode active (what
was live before the step included) and at 12,455,520 bytes under a pass-through
TorchDispatchMode; the trace had followed the second.

How the trace tells the engine's sum from a backward formula's own `add`: a post-hook on
each node marks the moment its apply has returned; the `aten.add.Tensor` calls dispatched
after that and before another node runs are the engine handing the node's outputs on.
Then the buffer drops the first gradient: if it held the last reference, the storage dies
before anything else happens, which is the fake step's sign of `use_count() == 1`. The
sum then takes the first gradient's place, born as that dies, as `add_` writes into it.
A node that dispatches nothing before handing on is seen only from its next call: its
sums stay out of place, as before this module.

Some backward formulas branch on the same test. `gather_backward`
(aten/src/ATen/native/TensorAdvancedIndexing.cpp) makes `result = grad.new_zeros(...)`
and then `result.scatter_add_(dim, index, grad)`, but `result.scatter_add(...)`, out of
place, when `areAnyTensorSubclassLike({index, grad})`; `cummaxmin_backward` does the same.
Under a dispatch mode each allocates a second result the user's step does not: a real
SEW-D attention layer peaked 786,432 bytes higher under a pass-through TorchDispatchMode
(its disentangled attention gathers from a [16, 24, 512] float32 score), which was
memlayout's prediction. These ops (FORMULA_OPS) are read as the sums are: where the
zeros they were given die right after them, the result took their place.
(`masked_select_backward` has the same branch with `masked_scatter`; a masked select's
real step peaked the same with and without a mode here, so it is not modelled.)
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

FORMULA_OPS = {"GatherBackward0": "aten.scatter_add.default", "CummaxBackward0": "aten.scatter_add.default",
               "CumminBackward0": "aten.scatter_add.default"}
"""Autograd node -> the out-of-place op its formula runs instead of the in-place form only under a dispatch mode
(a user's own backward that calls the op out of place is out of place in the user's step too)."""

HANDING_ON_KEY = "memlayout.handing_on"
"""A node's metadata key: the marker its post-hook sets while the engine hands its outputs on."""


def can_take_the_sum(first: Any, second: Any) -> bool:
    """Whether `first.add_(second)` is what torch's engine would do, as far as the tensors themselves say
    (`can_accumulate_inplace`: dense, not a view, same shape, dtype and device); who else holds `first` is
    the caller's to judge.

    A view keeps its base, and so its storage holds two references: never in place (a tied weight's gradient
    through `weight.T` is one).
    """
    import torch

    return (not first._is_view() and first.layout == torch.strided and first.shape == second.shape
            and first.dtype == second.dtype and first.device == second.device
            and (first.is_contiguous() or first.is_contiguous(memory_format=torch.channels_last)))


class BornRecord(Protocol):
    """What a sum's bookkeeping reads of a tracer's storage record (trace/records.py's StorageRecord): the
    event that allocated it. A protocol, so that the step never imports the trace that runs it."""

    born: int


class Accumulations:
    """The engine's gradient sums seen by one trace, and the one that may have been in place."""

    def __init__(self) -> None:
        self.handing_on: object | None = None
        """The marker of the node whose outputs the engine is handing on now; None inside an apply."""
        self.pending: tuple[BornRecord, BornRecord] | None = None
        """(the first gradient, the sum) of the last sum, until the next event."""

    def is_sum(self, func: Any, node: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this op is the engine summing two gradients, into a first one that `add_` could take, or a
        backward formula's FORMULA_OPS filling a tensor that its in-place form could write into."""
        import torch

        marker = self._watch(node) if node is not None else None
        if marker is not self.handing_on:
            self.handing_on = None
        if self.handing_on is None and node is not None and FORMULA_OPS.get(type(node).__name__) == str(func):
            first = args[0]
            return isinstance(first, torch.Tensor) and can_take_the_sum(first, first)
        if self.handing_on is None or func is not torch.ops.aten.add.Tensor or kwargs or len(args) != 2:
            return False
        first, second = args
        return isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and can_take_the_sum(first, second)

    def summed(self, first: BornRecord, total: BornRecord) -> None:
        """The sum of an `is_sum` op was recorded: it may take `first`'s place if `first` dies next."""
        self.pending = (first, total)

    def released(self, record: BornRecord, event: int) -> None:
        """`record` died at `event`: if it is the first gradient of the last sum and nothing happened between,
        the sum was written into it."""
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] is record and pending[1].born == event - 1:
            pending[1].born = event

    def _watch(self, node: Any) -> object:
        marker = node.metadata.get(HANDING_ON_KEY)
        if marker is None:
            marker = node.metadata[HANDING_ON_KEY] = object()
            node.register_hook(functools.partial(self._handing_on, marker))
        return marker

    def _handing_on(self, marker: object, _grad_inputs: Any, _grad_outputs: Any) -> None:
        self.handing_on = marker
