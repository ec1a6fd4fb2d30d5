"""Values on a device that is not here: each small fake tensor's real twin on the CPU (trace/fake_step.py says when
an op runs on the twins). A twin is forgotten with its fake tensor, and when an op without twins writes into it."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.activations.trace.op_arguments import writes, written

if TYPE_CHECKING:
    import torch


class ValueTwins:
    """The real twins, on the CPU, of fake tensors on `device`."""

    def __init__(self, fake_mode: Any, device: str | None) -> None:
        self.fake_mode = fake_mode
        self.device = device
        """The device ("cuda") whose small fake tensors carry values in real twins on the CPU; None: no twins."""
        self._twins: dict[int, tuple[Any, torch.Tensor]] = {}
        """id of a fake tensor -> (a weak reference to it, its real twin on the CPU)."""

    def give(self, fake: Any, real: torch.Tensor) -> None:
        """`real` (on the CPU) holds the values of `fake` (on the step's device) from now on."""
        key = id(fake)

        def forget(_: Any, key: int = key) -> None:
            self._twins.pop(key, None)

        self._twins[key] = (weakref.ref(fake, forget), real)

    def of(self, value: Any) -> Any:
        """The real twin of a fake tensor, None where it has none; a real tensor is its own."""
        if not isinstance(value, _torch.FakeTensor):
            return value
        found = self._twins.get(id(value))
        return found[1] if found is not None and found[0]() is value else None

    def real_argument(self, value: Any) -> Any:
        """An op's argument as the twins' op takes it: a fake tensor's twin, and the CPU for the step's device."""
        import torch

        if isinstance(value, torch.Tensor):
            return self.of(value)
        if isinstance(value, torch.device) and value.type == self.device:
            return torch.device("cpu")
        return value

    def fake_twinned(self, real: Any) -> Any:
        """A fake tensor on the step's device with `real`'s metadata, and `real` as its twin."""
        import torch

        if not isinstance(real, torch.Tensor):
            return real
        with self.fake_mode:
            fake = torch.empty_strided(tuple(real.shape), real.stride(), dtype=real.dtype, device=self.device)
        self.give(fake, real)
        return fake

    def forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        """What an op wrote without the twins (fake values into a tensor that had them): its twins no longer hold
        its values, nor those of any view of its storage."""
        if not self._twins or not writes(func):
            return
        storages = {_torch.storage_id(t.untyped_storage()) for t in written(func, args, kwargs)}
        for key, (ref, _) in list(self._twins.items()):
            fake = ref()
            if fake is None or _torch.storage_id(fake.untyped_storage()) in storages:
                self._twins.pop(key, None)
