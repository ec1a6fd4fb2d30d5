"""The GPU ranks are traced for, and each rank's figure compared with it, as one device's step is (budget.py).

On CUDA a rank runs out when the caching allocator's segments (its reserved peak, every
stream's pool together) and what the CUDA runtime holds beside them (the context,
cuBLAS's memory and its workspaces' segments: device/cuda_runtime.py) do not fit the card.
NCCL's own buffers (its channels' FIFOs, `NCCL_BUFFSIZE` each, 4 MiB by default, and its
proxy's) come from NCCL's allocations outside the caching allocator: they are in neither
figure, and torch reports no size for them; the report says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memlayout.activations.device.cuda_runtime import cuda_runtime
from memlayout.activations.device.expandable_segments import allocator_config
from memlayout.activations.device.gpus import (
    DEFAULT_GPU,
    GpuSpec,
    gpu_spec,
    requested_gpu,
    spec_for_device_name,
)
from memlayout.activations.ranks.facts import RankPeak, RanksCard

NCCL_NOTE = ("NCCL's own buffers (its channels' FIFOs, NCCL_BUFFSIZE each, 4 MiB by default) are allocated by NCCL "
             "outside the caching allocator: in neither figure, and torch reports no size for them")


def ranks_card(request: Any) -> RanksCard | None:
    """The card a CUDA request's ranks are for (`gpu`, `gpu_memory`, else the present GPU, else the default one);
    None on the CPU."""
    if not (str(request.device).startswith("cuda") or request.gpu is not None or request.gpu_memory is not None):
        return None
    gpu = requested_gpu(request.gpu, request.gpu_memory) or _present() or gpu_spec(DEFAULT_GPU)
    config = allocator_config()
    return RanksCard(gpu, cuda_runtime(gpu.capability), config.expandable_segments, config.unmodelled)


def _present() -> GpuSpec | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return spec_for_device_name(torch.cuda.get_device_name())


def on_card(peak: RankPeak, card: RanksCard | None) -> RankPeak:
    """The rank with the figure its card compares: the reserved peak plus the runtime beside it."""
    if card is None or peak.reserved is None:
        return peak
    return replace(peak, compared_bytes=peak.reserved.reserved_bytes + card.runtime.beside_step_bytes)
