"""What a GPU holds for the CUDA runtime besides the step's tensors: the context, and cuBLAS's workspaces.

Neither is a tensor of the step, so neither is in a trace or its peak; `memlayout
activations --device cuda` states them on lines of their own.

- **The CUDA context** (the driver's per-process state, loaded kernels) lives outside
  the caching allocator, and its size depends on the driver, the CUDA version and the
  GPU. memlayout has one measurement of it, not a rule: 527 MiB (552,402,944 bytes of
  the driver's used memory after `torch.cuda.init()`) on an NVIDIA H200, driver
  580.159.04, CUDA 13.0, torch 2.11.0+cu130 (benchmarks/results/gpu/probe-h200.json,
  `context.driver_used_after_init`).
- **cuBLAS's own memory outside the allocator**: the first float32 matmul there took
  98 MiB more of the driver's memory (`first_matmul_float32.driver_used_delta`), of
  which 32 MiB is the workspace's segment in the caching allocator (`reserved_delta`);
  the other 66 MiB (69,206,016 bytes: the library's kernels and handle) is outside it.
  Counted once: it is the process's, not a handle's.
- **cuBLAS's workspace** comes from the caching allocator, once per (cuBLAS handle,
  stream): aten/src/ATen/cuda/CublasHandlePool.cpp, `setWorkspaceForHandle` allocates
  `getChosenWorkspaceSize()` through `getNewWorkspace()`. Handles are per thread
  (`getCurrentCUDABlasHandle`'s thread_local PoolWindow), and a training step runs
  matmuls on two threads: forward's, and autograd's device thread for backward. The
  size is `parseChosenWorkspaceSize()`: `CUBLAS_WORKSPACE_CONFIG` (":SIZE:COUNT" pairs,
  SIZE in KiB, summed), by default 32 MiB on compute capability 9.0 (Hopper:
  `4096 * 8 * 1024`) and ":4096:2:16:8" elsewhere (8 MiB + 128 KiB).
- **cuBLASLt's workspace** is separate unless `TORCH_CUBLASLT_UNIFIED_WORKSPACE` is set
  (`getCUDABlasLtWorkspace`): `CUBLASLT_WORKSPACE_SIZE` KiB, by default 1024 KiB
  (`parseCUDABlasLtWorkspaceSize`, "according to #73328"), taken by a matmul with a bias.

On the H200 the step's workspaces measured 65 MiB in `memory_allocated()`: two cuBLAS
workspaces of 32 MiB and one of cuBLASLt (docs/gpu.md, "Predicted against measured").
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from memlayout.activations.device.cuda_allocator import round_size, segment_size

CONTEXT_BYTES_MEASURED = 552_402_944
"""The driver's used memory after `torch.cuda.init()` on the one GPU measured (see the module's docstring)."""
CONTEXT_MEASURED_ON = "an NVIDIA H200, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130"
CUBLAS_OUTSIDE_ALLOCATOR_MEASURED = 102_760_448 - 33_554_432
"""cuBLAS's first use beyond its workspace's segment, on the same GPU (see the module's docstring)."""
CUBLAS_HANDLES_PER_STEP = 2
"""Threads that run matmuls in a training step, each with its own cuBLAS handle: forward's and autograd's."""
CUBLAS_WORKSPACE_HOPPER = 4096 * 8 * 1024
"""parseChosenWorkspaceSize's default on compute capability 9.0."""
CUBLAS_WORKSPACE_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
"""parseChosenWorkspaceSize's default elsewhere, ":4096:2:16:8"."""
CUBLASLT_WORKSPACE_DEFAULT = 1024 * 1024
"""parseCUDABlasLtWorkspaceSize's default, 1024 KiB."""
_CONFIG_PAIR = re.compile(r":([0-9]+):([0-9]+)")


@dataclass(frozen=True)
class CudaRuntime:
    """The CUDA runtime's memory beside a step's tensors."""

    context_bytes: int
    """The CUDA context, outside the caching allocator: a measured figure, not a rule."""
    context_measured_on: str
    outside_allocator_bytes: int
    """What cuBLAS's first use takes outside the caching allocator besides its workspace: a measured figure."""
    cublas_workspace_bytes: int
    """One cuBLAS handle's workspace, from the caching allocator."""
    cublas_handles: int
    cublaslt_workspace_bytes: int
    """cuBLASLt's workspace, from the caching allocator (0 when it shares cuBLAS's)."""
    capability: tuple[int, int] | None
    """The compute capability the workspace size is for; None when no GPU was named (Hopper's size is taken)."""

    @property
    def workspace_bytes(self) -> int:
        """What the workspaces add to `memory_allocated()`."""
        return self.cublas_handles * self.cublas_workspace_bytes + self.cublaslt_workspace_bytes

    @property
    def workspace_reserved_bytes(self) -> int:
        """The segments they take in `memory_reserved()`: each is a request of its own to the allocator."""
        sizes = [self.cublas_workspace_bytes] * self.cublas_handles + [self.cublaslt_workspace_bytes]
        return sum(segment_size(round_size(size)) for size in sizes if size)

    @property
    def beside_step_bytes(self) -> int:
        """What the process holds on the GPU beside the step's own segments: the context, cuBLAS's memory outside
        the allocator, and the workspaces' segments. A GPU runs out when this plus the reserved peak exceeds it."""
        return self.context_bytes + self.outside_allocator_bytes + self.workspace_reserved_bytes


def chosen_workspace_size(capability: tuple[int, int] | None, environ: Mapping[str, str]) -> int:
    """cuBLAS's workspace per handle, as `parseChosenWorkspaceSize` computes it."""
    default = CUBLAS_WORKSPACE_HOPPER if capability in (None, (9, 0)) else CUBLAS_WORKSPACE_DEFAULT
    config = environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config is None:
        return default
    pairs = _CONFIG_PAIR.findall(config)
    if not pairs:
        return default  # torch warns "Could not parse CUBLAS_WORKSPACE_CONFIG" and takes its default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublaslt_workspace_size(environ: Mapping[str, str]) -> int:
    """cuBLASLt's workspace, as `parseCUDABlasLtWorkspaceSize` and `getCUDABlasLtWorkspace` decide it."""
    if environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE") == "1":  # c10::utils::check_env: only "1" is true
        return 0
    value = environ.get("CUBLASLT_WORKSPACE_SIZE")
    try:
        return int(value) * 1024 if value is not None else CUBLASLT_WORKSPACE_DEFAULT
    except ValueError:
        return CUBLASLT_WORKSPACE_DEFAULT  # torch warns "invalid CUBLASLT_WORKSPACE_SIZE" and takes its default


def cuda_runtime(capability: tuple[int, int] | None = None, environ: Mapping[str, str] | None = None) -> CudaRuntime:
    """The context and workspaces a training step's process holds on a GPU of `capability`.

    Args:
        capability: (major, minor) of the target GPU; None takes Hopper's (9, 0) workspace, the larger.
        environ: The environment the step will run in (cuBLAS's size settings); this process's by default.
    """
    env = os.environ if environ is None else environ
    return CudaRuntime(
        context_bytes=CONTEXT_BYTES_MEASURED,
        context_measured_on=CONTEXT_MEASURED_ON,
        outside_allocator_bytes=CUBLAS_OUTSIDE_ALLOCATOR_MEASURED,
        cublas_workspace_bytes=chosen_workspace_size(capability, env),
        cublas_handles=CUBLAS_HANDLES_PER_STEP,
        cublaslt_workspace_bytes=cublaslt_workspace_size(env),
        capability=capability,
    )
