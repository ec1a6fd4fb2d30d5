"""What `memlayout flatten` is asked to do: shared by the driver and every writer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

KEEP = "keep"
"""The default `--device`: every tensor stays on the device IN records (see `keeps_devices`)."""

Progress = Callable[[str, int, int], None]
"""progress(task, done, total): how many bytes of a task ("copy", "verify") are done."""


@dataclass(frozen=True)
class FlattenOptions:
    """What `memlayout flatten` was asked to do."""

    out: str | None
    """Destination; None with `check` (or `in_place`, where it is IN)."""
    device: str = KEEP
    """KEEP (OUT records each tensor's device as IN does), "auto", "cpu", "cuda" or "cuda:N"."""
    align: int | None = None
    """Slot alignment in bytes, as asked (`--align`, `alignment` in [tool.memlayout]); None: slots on
    `DEFAULT_ALIGN` bytes, and a safetensors file keeps its own 8-byte data section."""
    trust: bool = False
    main_module: str | None = None
    """With `trust`: the module that defines what a script's pickle names `__main__.Name`.
    OUT names them `__main__.Name` again, so the script that loads IN loads OUT."""
    check: bool = False
    in_place: bool = False
    verify: bool = True
    force: bool = False
    """Write into a non-empty output folder, replacing only the files flatten writes."""
    to: str | None = None
    """The format OUT is written in (`--to safetensors`); None keeps IN's."""
    tensors_only: bool = False
    """With `to`: leave out what is not a tensor (optimizer hyper-parameters, step counters) instead of refusing."""

    @property
    def keeps_devices(self) -> bool:
        """OUT records each storage's device as IN records it.

        A torch.save file names each storage's device in its persistent id, and
        writing a name needs no device: the bytes move on the CPU and OUT records
        IN's `cuda:0`, so a CPU-only machine flattens a CUDA checkpoint into a CUDA
        checkpoint. Writers that can only record the device a tensor is on
        (TorchScript, torch.export) need that device.
        """
        return self.device == KEEP
