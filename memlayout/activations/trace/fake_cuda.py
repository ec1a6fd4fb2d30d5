"""A fake CUDA step that runs as it would on the target GPU, with or without a GPU here.

Three things differ from a plain FakeTensorMode step on CUDA tensors when this
machine has no GPU (or `--gpu` names another one than it has):
- attention: torch would choose its kernel from this machine's GPU (none: math);
  device/sdpa_backend.py chooses for the target instead;
- autocast: `torch.autocast("cuda")` switches itself off without a device; step/run.py
  enables CUDA's policy anyway (`_torch.cuda_autocast_without_device`), and so does a
  checkpointed module's rerun (plans/apply.py);
- backward: torch's engine stops before the first node without a device;
  step/gpu_free_backward.py runs it (why, with citations, is written there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from memlayout import _torch
from memlayout.activations.device.gpus import DEFAULT_GPU, GpuSpec, gpu_spec
from memlayout.activations.device.sdpa_backend import SdpaRouting
from memlayout.activations.step import gpu_free_backward
from memlayout.activations.step.gpu_free_backward import cuda_needs_it


class FakeCudaRuntime:
    """Entered around a fake CUDA step: attention for `gpu`, and backward without a device where needed."""

    def __init__(self, gpu: GpuSpec, *, assumed: bool, backward_in_python: bool) -> None:
        self.gpu = gpu
        self.assumed = assumed
        """No `--gpu` was given and no GPU is present: `gpu` is DEFAULT_GPU."""
        self.backward_in_python = backward_in_python
        self.routing = SdpaRouting(gpu)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.routing.mode())
            # A checkpointed rerun enables autocast again itself (plans/apply.py): torch's warning that it is off
            # would not be true.
            stack.enter_context(_torch.cuda_autocast_off_unsaid())
            if self.backward_in_python:
                stack.enter_context(gpu_free_backward.backward_in_python())
            yield

    def note(self) -> str:
        """What the report says about the target: the GPU, and which attention kernels ran."""
        chosen = ", ".join(f"{name} x{count}" for name, count in sorted(self.routing.chosen.items()))
        target = f"traced for {self.gpu.describe()}"
        if self.assumed:
            target += ", assumed as no GPU is present (--gpu NAME names another)"
        if chosen:
            target += f"; attention ran as torch runs it there: {chosen}"
        if self.backward_in_python:
            target += ("; backward ran in memlayout's loop over the autograd graph, as torch's engine needs a GPU "
                       "for CUDA tensors (hooks on autograd nodes and activations do not run)")
        return target


def fake_cuda_for(gpu: str | GpuSpec | None) -> FakeCudaRuntime | None:
    """What a fake CUDA step needs here: None where a GPU is present and `gpu` is None (torch decides).

    Raises:
        UsageError: `gpu` names no known GPU.
    """
    import torch

    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu) if gpu is not None else None
    present = torch.cuda.is_available()
    if spec is None and present:
        return None
    return FakeCudaRuntime(spec or gpu_spec(DEFAULT_GPU), assumed=spec is None,
                           backward_in_python=cuda_needs_it())

