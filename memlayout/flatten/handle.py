"""What `memlayout.flatten` returns: the flat buffers, usable as single tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memlayout.flatten.plan import FlatPlan

if TYPE_CHECKING:
    import torch


@dataclass
class FlatGroup:
    """One flat buffer and the tensors living in it."""

    label: str
    """e.g. "params float32 cpu requires_grad" or "rnn lstm"."""
    key: tuple[str, ...]
    """The grouping key: (section, role, device, dtype, requires_grad) or ("rnn", path)."""
    data: torch.Tensor
    """The whole buffer as one 1-D tensor of the group's dtype, padding included
    (zero at flatten time). A fused grad-norm, all-reduce or optimizer step over
    it covers every tensor of the group."""
    names: tuple[str, ...]
    """Names of the tensors in the buffer, in slot order."""
    grad: torch.Tensor | None = None
    """The parallel flat gradient buffer when `grads=True`; every parameter's
    `.grad` is a view into it. Keep it by zeroing with
    `optimizer.zero_grad(set_to_none=False)`: set_to_none drops the views."""
    rnn_module: str | None = None
    """Set for an RNN's own buffer."""

    @property
    def is_parameters(self) -> bool:
        """Whether the group holds parameters (an RNN's weights count)."""
        return self.key[0] == "rnn" or (len(self.key) > 1 and self.key[1] == "param")


@dataclass
class FlatHandle:
    """The result of flattening in place."""

    plan: FlatPlan
    groups: list[FlatGroup]
    changed: bool
    """False when the input was already flat and nothing was touched."""
    bytes_copied: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What flatten could not fix (ML402 weight-dropout RNNs, ...)."""

    def parameter_groups(self) -> list[FlatGroup]:
        """Groups holding parameters, e.g. for an optimizer over flat tensors."""
        return [group for group in self.groups if group.is_parameters]

    def buffers(self) -> list[torch.Tensor]:
        """Each group's whole flat buffer, as its typed 1-D tensor."""
        return [group.data for group in self.groups]
