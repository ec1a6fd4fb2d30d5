"""What a step must fit in, and which of its figures is compared with it.

On the CPU a step runs out when its live tensors do not fit: the figure compared is
the trace's peak of live tensor bytes (`Summary.peak_bytes`).

On a GPU what runs out is the CUDA caching allocator's reserved memory, not the bytes
its tensors hold: a freed block stays in its segment for the next request of a size
it can serve, and a request no free block serves takes a new segment, so the
segments (`max_memory_reserved()`) grow past the tensors (`max_memory_allocated()`);
a 7B model's step reserved 570 MiB more in its second step than in its first on an
H200 (allocator_replay.py). The CUDA context and cuBLAS's workspaces take memory
beside the step's tensors (cuda_runtime.py). So on CUDA the figure compared is the
allocator model's reserved peak plus the context and the workspaces, and a budget
given as a fraction is that fraction of the card's memory as torch reports it
(`total_memory`, gpus.py), as vLLM's `gpu_memory_utilization` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memlayout.activations.device.cuda_runtime import cuda_runtime
from memlayout.activations.device.gpus import GpuSpec
from memlayout.activations.sizes import BudgetSpec
from memlayout.errors import SettingError, UsageError
from memlayout.format_bytes import human_bytes

if TYPE_CHECKING:
    from memlayout.activations.summary import Summary

RESERVED = "reserved"
PEAK = "peak"


@dataclass(frozen=True)
class Budget:
    """The bytes a step must fit in, and the figure of a traced step that is compared with them."""

    bytes: int
    """What the compared figure must not exceed."""
    said: str
    """Where the budget came from, in words."""
    runtime_bytes: int | None = None
    """On CUDA, what the CUDA runtime holds beside the step's tensors (the context, cuBLAS's memory and its workspaces'
    segments), added to the reserved peak; None on the CPU, where the live tensors' peak is compared."""

    @property
    def figure(self) -> str:
        """"reserved" (CUDA: the reserved peak plus the runtime) or "peak" (the live tensors' peak)."""
        return PEAK if self.runtime_bytes is None else RESERVED

    def describe_figure(self) -> str:
        """The figure compared, in words."""
        if self.runtime_bytes is None:
            return "the peak of live tensor bytes"
        return (f"the caching allocator's reserved peak plus {human_bytes(self.runtime_bytes)} of CUDA context, "
                "cuBLAS and its workspaces")

    def judged(self, summary: Summary) -> int:
        """The figure of a traced step compared with the budget."""
        if self.runtime_bytes is None:
            return summary.peak_bytes
        if summary.reserved_peak_bytes is None:
            raise ValueError("a CUDA budget needs the trace's reserved peak: summarize it with cuda=True")
        return summary.reserved_peak_bytes + self.runtime_bytes

    def fits(self, summary: Summary) -> bool:
        return self.judged(summary) <= self.bytes

    def overhead(self, summary: Summary) -> int:
        """What the judged figure adds to the live peak on this trace: the planner, which estimates live peaks,
        aims this much below the budget first."""
        return self.judged(summary) - summary.peak_bytes


def resolve_budget(spec: BudgetSpec | int | None, *, cuda: bool, gpu: GpuSpec | None) -> Budget | None:
    """The budget for a step on `cuda` (with its target GPU's row) or on the CPU; None without one.

    An int is bytes. With `cuda`, the reserved peak plus the CUDA runtime is compared; without a
    budget given, `--fit` takes the whole card (`card_budget`).

    Raises:
        UsageError: a fraction without a GPU to take it of, or a budget that is not positive.
    """
    if spec is None:
        return None
    if isinstance(spec, int):
        spec = BudgetSpec(bytes=spec)
    runtime = _runtime_bytes(gpu) if cuda else None
    if spec.fraction is not None:
        if not cuda or gpu is None:
            raise SettingError(f"`budget` {spec.fraction:g} is a share of a GPU's memory, and the step is not for one",
                               "name the GPU with `gpu=NAME` (no GPU needed here), or give `budget` as a size")
        total = gpu.total_memory
        budget = int(total * spec.fraction)
        said = (f"--budget {spec.fraction:g} of the {gpu.device_name}'s {human_bytes(total)} ({total} bytes, torch's "
                f"total_memory, {gpu.memory_source})")
    else:
        assert spec.bytes is not None
        budget, said = spec.bytes, f"--budget {human_bytes(spec.bytes)}"
    if budget <= 0:
        raise UsageError(f"the budget {budget} is not positive")
    return Budget(budget, said, runtime)


def card_budget(gpu: GpuSpec) -> Budget:
    """The whole card: its memory as torch reports it, against the reserved peak plus the CUDA runtime."""
    return Budget(gpu.total_memory, f"--gpu {gpu.key}: the {gpu.device_name}'s {human_bytes(gpu.total_memory)} "
                                    f"({gpu.total_memory} bytes, torch's total_memory, {gpu.memory_source})",
                  _runtime_bytes(gpu))


def _runtime_bytes(gpu: GpuSpec | None) -> int:
    return cuda_runtime(gpu.capability if gpu is not None else None).beside_step_bytes
