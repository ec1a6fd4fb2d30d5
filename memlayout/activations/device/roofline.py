"""How long an op takes at best on a device: the roofline of its FLOPs and the bytes it moves.

A checkpointed module's price is the time its forward takes again during backward.
FLOPs alone call a layer norm free (torch's flop counter counts element-wise ops as
0), yet rerunning 40 RMSNorms reads and writes every activation they touch. Each op
is priced at `max(FLOPs / peak FLOP/s, bytes read and written / peak bandwidth)`, the
roofline bound: the fastest it can run, compute-bound or memory-bound, whichever binds.
A view moves nothing.

The rates are a GPU's datasheet figures (gpus.py); the CPU's are measured on this
machine, once per process (`cpu_roofline`): a float32 and a bf16 matmul, and a copy.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from memlayout.activations.device.gpus import GpuSpec

_HALF = frozenset({"torch.bfloat16", "torch.float16"})
CPU_RATES_SOURCE = "measured here: a 512x512 matmul in float32 and bf16, a 16 MiB copy"


@dataclass(frozen=True)
class Roofline:
    """The peak rates of one device."""

    device: str
    """What the rates are of, in words."""
    float32_flops: float
    """FLOP/s of a float32 matmul."""
    half_flops: float
    """FLOP/s of a bf16/fp16 matmul."""
    memory_bandwidth: float
    """Bytes/s read and written."""
    source: str
    """Where the rates come from."""

    def op_seconds(self, flops: int, moved_bytes: int, dtype: object) -> float:
        """The roofline time of one op: its FLOPs at the rate of its dtype, or its bytes at the bandwidth."""
        rate = self.half_flops if str(dtype) in _HALF else self.float32_flops
        return max(flops / rate, moved_bytes / self.memory_bandwidth)


def gpu_roofline(spec: GpuSpec) -> Roofline:
    """A GPU's datasheet rates."""
    return Roofline(spec.device_name, spec.float32_flops, spec.half_flops, spec.memory_bandwidth,
                    "NVIDIA's datasheet, dense")


@functools.cache
def cpu_roofline() -> Roofline:
    """This machine's CPU, measured: the best of a few timed runs of each, with torch's threads as they are.

    Each rate is rounded down to a power of two, so that the plans a search prefers do not
    change with the load the machine happens to carry while it measures (about 0.2 s, once).
    """
    import torch

    def best_seconds(work: Callable[[], object], repeats: int = 5) -> float:
        work()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            times.append(time.perf_counter() - start)
        return max(min(times), 1e-9)

    size = 512
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        matrix = torch.ones(size, size, dtype=dtype)
        rates[dtype] = 2 * size**3 / best_seconds(functools.partial(torch.mm, matrix, matrix))
    source = torch.empty(16 << 20, dtype=torch.uint8)
    target = torch.empty_like(source)
    bandwidth = 2 * source.numel() / best_seconds(lambda: target.copy_(source))
    return Roofline("this machine's CPU", _power_of_two(rates[torch.float32]), _power_of_two(rates[torch.bfloat16]),
                    _power_of_two(bandwidth), CPU_RATES_SOURCE)


def _power_of_two(rate: float) -> float:
    return float(2 ** int(rate).bit_length() // 2)
