"""The GPUs `--gpu NAME` can name: compute capability, memory and SM count, in one table.

A fake CUDA step follows the target GPU where the GPU decides something: which
attention kernel torch runs (sdpa_backend.py reads the capability), and how much
memory there is to fit in. Each row is what `torch.cuda.get_device_properties`
reports on that GPU: `name`, `major.minor`, `total_memory` and
`multi_processor_count`. `source` says where the row comes from: "probe" rows were
recorded on the GPU itself by benchmarks/gpu_probe.py (benchmarks/results/gpu/), the
others from NVIDIA's specifications, whose memory is what nvidia-smi shows as total
(torch's `total_memory`, the driver's usable figure, is up to 1% lower).
tests/activations/test_gpus.py checks the probe rows against the recorded figures
and, on a machine with a GPU, the present GPU's row against torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlayout.errors import UsageError

MIB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as torch describes it."""

    key: str
    """What `--gpu` takes: "h100", "a100-80gb"."""
    device_name: str
    """`get_device_properties().name`: "NVIDIA H100 80GB HBM3"."""
    capability: tuple[int, int]
    """(major, minor): 9.0 for Hopper, 8.0 for A100, 8.9 for Ada."""
    total_memory: int
    """Bytes of device memory."""
    sm_count: int
    """`multi_processor_count`."""
    source: str
    """"probe" (recorded on the GPU, benchmarks/results/gpu/) or "spec" (NVIDIA's figures)."""

    def describe(self) -> str:
        """"NVIDIA H100 80GB HBM3 (sm 9.0, 79.6 GiB, 132 SMs)"."""
        return (f"{self.device_name} (sm {self.capability[0]}.{self.capability[1]}, "
                f"{self.total_memory / (1 << 30):.1f} GiB, {self.sm_count} SMs)")


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("h200", "NVIDIA H200", (9, 0), 150_109_880_320, 132, "probe"),
    GpuSpec("h100", "NVIDIA H100 80GB HBM3", (9, 0), 81_559 * MIB, 132, "spec"),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", (9, 0), 81_559 * MIB, 114, "spec"),
    GpuSpec("b200", "NVIDIA B200", (10, 0), 183_359 * MIB, 148, "spec"),
    GpuSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), 81_920 * MIB, 108, "spec"),
    GpuSpec("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), 40_960 * MIB, 108, "spec"),
    GpuSpec("l40s", "NVIDIA L40S", (8, 9), 46_068 * MIB, 142, "spec"),
    GpuSpec("l4", "NVIDIA L4", (8, 9), 23_034 * MIB, 58, "spec"),
    GpuSpec("a10g", "NVIDIA A10G", (8, 6), 23_028 * MIB, 80, "spec"),
    GpuSpec("4090", "NVIDIA GeForce RTX 4090", (8, 9), 24_564 * MIB, 128, "spec"),
    GpuSpec("3090", "NVIDIA GeForce RTX 3090", (8, 6), 24_576 * MIB, 82, "spec"),
    GpuSpec("t4", "Tesla T4", (7, 5), 15_360 * MIB, 40, "spec"),
    GpuSpec("v100", "Tesla V100-SXM2-16GB", (7, 0), 16_384 * MIB, 80, "spec"),
)

DEFAULT_GPU = "h100"
"""The GPU a fake CUDA step assumes where none is present and `--gpu` names none."""

_BY_KEY = {spec.key: spec for spec in GPUS}


def gpu_spec(name: str) -> GpuSpec:
    """The row `--gpu NAME` names (case-insensitive).

    Raises:
        UsageError: no row has that name; the message lists the known ones.
    """
    spec = _BY_KEY.get(name.strip().lower())
    if spec is None:
        raise UsageError(f"unknown --gpu {name!r}", f"use one of {', '.join(sorted(_BY_KEY))}")
    return spec


def spec_for_device_name(device_name: str) -> GpuSpec | None:
    """The row of the GPU torch names `device_name` (`get_device_properties().name`), if the table has it."""
    return next((spec for spec in GPUS if spec.device_name == device_name), None)
