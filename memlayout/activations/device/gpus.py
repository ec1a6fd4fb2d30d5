"""The GPUs `--gpu NAME` can name: compute capability, memory, SMs and peak rates, in one table.

A fake CUDA step follows the target GPU where the GPU decides something: which
attention kernel torch runs (sdpa_backend.py reads the capability), how much
memory there is to fit in, and how long a checkpointed module takes to rerun
(roofline.py reads the peak rates).

**Memory** is what `torch.cuda.get_device_properties().total_memory` reports on the
card: CUDA's `totalGlobalMem`, the frame buffer less what the driver reserves. That
is what runs out, not the larger figure nvidia-smi prints as "Total" (on an H100
80GB HBM3 with driver 580.159.04: 81,559 MiB in nvidia-smi, 81,079 MiB in torch).
The driver's reservation differs from card to card and from driver to driver
(81,079 to 81,106 MiB on H100s), so each row says where its figure comes from:

- "measured": torch's `total_memory` on the card itself, in this project's GPU runs
  (benchmarks/results/gpu/: the H200's probe, the H100's `device-h100.txt`);
- "reported": `totalGlobalMem` as a public report from a Linux machine shows it
  (deviceQuery's bytes, or torch's repr), the lowest of the reports that can be cited;
  docs/gpu.md lists each report;
- "derived": no report found; NVIDIA's figure less the reservation measured on the
  card of the same memory (the H100 PCIe: the H100's 480 MiB; the H100 NVL: nvidia-smi's
  95,830 MiB less the same), or a share torch reported (the H100 96GB HBM2e of Meta's
  Grand Teton hosts, which torchtitan's Table 1 ran on: its logs' `memory: 33.21GiB(34.95%)`
  and `44.84GiB(47.19%)`, used over `total_memory`, pytorch/torchtitan#1884, both 95.02 GiB).

tests/activations/device/test_gpus.py checks the measured rows against the recorded figures
and, on a machine with a GPU, the present GPU's row against torch.

**Peak rates** are NVIDIA's datasheet figures, dense (no sparsity): float32 on the CUDA
cores (torch leaves TF32 off for matmuls by default), bf16/fp16 on the tensor cores
with float32 accumulation, and the memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlayout.errors import UsageError

MIB = 1 << 20
TERA = 10**12
GIGA = 10**9


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as torch describes it, and its peak rates."""

    key: str
    """What `--gpu` takes: "h100", "a100-80gb"."""
    device_name: str
    """`get_device_properties().name`: "NVIDIA H100 80GB HBM3"."""
    capability: tuple[int, int]
    """(major, minor): 9.0 for Hopper, 8.0 for A100, 8.9 for Ada."""
    total_memory: int
    """Bytes of device memory torch reports (`total_memory`: what an allocation can take)."""
    sm_count: int
    """`multi_processor_count`."""
    memory_source: str
    """"measured", "reported" or "derived": where `total_memory` comes from (see the module's docstring)."""
    float32_flops: int
    """Peak float32 FLOP/s (NVIDIA's datasheet)."""
    half_flops: int
    """Peak bf16/fp16 FLOP/s on the tensor cores, dense, float32 accumulation (NVIDIA's datasheet)."""
    memory_bandwidth: int
    """Peak memory bandwidth in bytes/s (NVIDIA's datasheet)."""

    def describe(self) -> str:
        """"NVIDIA H100 80GB HBM3 (sm 9.0, 79.2 GiB, 132 SMs)"."""
        return (f"{self.device_name} (sm {self.capability[0]}.{self.capability[1]}, "
                f"{self.total_memory / (1 << 30):.1f} GiB, {self.sm_count} SMs)")


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("h200", "NVIDIA H200", (9, 0), 150_109_880_320, 132, "measured", 67 * TERA, 989 * TERA, 4_800 * GIGA),
    GpuSpec("h100", "NVIDIA H100 80GB HBM3", (9, 0), 81_079 * MIB, 132, "measured", 67 * TERA, 989 * TERA,
            3_350 * GIGA),
    GpuSpec("h100-pcie", "NVIDIA H100 PCIe", (9, 0), (81_559 - 480) * MIB, 114, "derived", 51 * TERA, 756 * TERA,
            2_000 * GIGA),
    GpuSpec("h100-nvl", "NVIDIA H100 NVL", (9, 0), (95_830 - 480) * MIB, 132, "derived", 60 * TERA, 835 * TERA,
            3_900 * GIGA),
    GpuSpec("h100-96gb", "NVIDIA H100 96GB HBM2e", (9, 0), 97_300 * MIB, 132, "derived", 67 * TERA, 989 * TERA,
            2_400 * GIGA),
    GpuSpec("b200", "NVIDIA B200", (10, 0), 191_514_411_008, 148, "reported", 75 * TERA, 2_250 * TERA, 8_000 * GIGA),
    GpuSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), 84_987_740_160, 108, "reported", 19_500 * GIGA,
            312 * TERA, 2_039 * GIGA),
    GpuSpec("a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), 42_298_834_944, 108, "reported", 19_500 * GIGA,
            312 * TERA, 1_555 * GIGA),
    GpuSpec("l40s", "NVIDIA L40S", (8, 9), 47_576_711_168, 142, "reported", 91_600 * GIGA, 362 * TERA, 864 * GIGA),
    GpuSpec("l4", "NVIDIA L4", (8, 9), 23_570_219_008, 58, "reported", 30_300 * GIGA, 121 * TERA, 300 * GIGA),
    GpuSpec("a10g", "NVIDIA A10G", (8, 6), 23_609_475_072, 80, "reported", 31_200 * GIGA, 125 * TERA, 600 * GIGA),
    GpuSpec("4090", "NVIDIA GeForce RTX 4090", (8, 9), 25_386_352_640, 128, "reported", 82_600 * GIGA,
            165_200 * GIGA, 1_008 * GIGA),
    GpuSpec("3090", "NVIDIA GeForce RTX 3090", (8, 6), 25_327_697_920, 82, "reported", 35_600 * GIGA, 71 * TERA,
            936 * GIGA),
    GpuSpec("t4", "Tesla T4", (7, 5), 15_835_660_288, 40, "reported", 8_100 * GIGA, 65 * TERA, 320 * GIGA),
    GpuSpec("v100", "Tesla V100-SXM2-16GB", (7, 0), 16_935_682_048, 80, "reported", 15_700 * GIGA, 125 * TERA,
            900 * GIGA),
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
        raise UsageError(f"unknown `gpu` {name!r}", f"use one of {', '.join(sorted(_BY_KEY))}")
    return spec


def spec_for_device_name(device_name: str) -> GpuSpec | None:
    """The row of the GPU torch names `device_name` (`get_device_properties().name`), if the table has it."""
    return next((spec for spec in GPUS if spec.device_name == device_name), None)


GIVEN_MEMORY = "given"
"""`memory_source` of a row whose memory `--gpu-memory` gave."""


def requested_gpu(name: str | GpuSpec | None, memory: int | None = None) -> GpuSpec | None:
    """The GPU a step is for: `--gpu`'s row (the default GPU's where only `memory` is given), with `--gpu-memory`'s
    memory in place of the row's when given; None when neither is.

    Raises:
        UsageError: an unknown name.
    """
    if name is None and memory is None:
        return None
    spec = name if isinstance(name, GpuSpec) else gpu_spec(name or DEFAULT_GPU)
    return spec if memory is None else replace(spec, total_memory=memory, memory_source=GIVEN_MEMORY)
