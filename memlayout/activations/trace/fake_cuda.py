"""A fake CUDA step that runs as it would on the target GPU, with or without a GPU here, on any torch build.

Fake CUDA tensors need no CUDA kernel: FakeTensorMode runs each op's meta kernel. What a
build without CUDA (the Linux CPU wheel, macOS) lacks, `give_torch_fake_cuda` gives it, so
that both builds trace the same step:
- a CUDA device guard: torch's own fake one, the guard a CUDA build without a GPU runs
  fake CUDA tensors with (`_torch.fake_cuda_device_guard` says how);
- the ops a CUDA build runs whole on CUDA tensors and a build without CUDA splits into
  parts (`WHOLE_ON_CUDA`): each has a CompositeImplicitAutograd kernel, which the
  dispatcher runs for a device with no kernel of its own, and a CUDA kernel in
  libtorch_cuda. On the CPU wheel `silu_backward` on a fake CUDA tensor became
  sigmoid, mul, rsub, mul, add, mul: temporaries the GPU never allocates. Each is given a
  CUDA kernel that is never run (the fake mode answers first), so the dispatcher passes
  it whole, through its autograd formula, as on the CUDA build;
- what a CUDA build reads from its CUDA libraries: the cuDNN version (sdpa_backend.py).
What is not given: the choices ATen's composite kernels make from whether torch was
compiled with cuDNN (`detail::getCUDAHooks().compiledWithCuDNN()`). BatchNorm then runs
`native_batch_norm` where the CUDA build runs `cudnn_batch_norm`, whose fake outputs
and saved tensors are of the same sizes (its reserve is empty on fake tensors), and cuDNN's
RNNs are refused on both builds (`refuse_what_no_build_traces`).

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
import functools
from collections.abc import Iterator
from typing import Any

from memlayout import _torch
from memlayout.activations.device.gpus import DEFAULT_GPU, GpuSpec, gpu_spec
from memlayout.activations.device.sdpa_backend import SdpaRouting
from memlayout.activations.step import gpu_free_backward
from memlayout.activations.step.gpu_free_backward import cuda_needs_it
from memlayout.errors import UsageError

CUDA_WHEELS = "https://download.pytorch.org/whl/cu130"
"""Where pip finds torch's CUDA builds (on Linux, plain `pip install torch` is one too)."""


WHOLE_ON_CUDA = ("_fused_rms_norm", "mish_backward", "silu_backward")
"""The aten ops with a CompositeImplicitAutograd kernel that torch's CUDA build also gives a CUDA kernel (2.14.1+cu130:
`torch._C._dispatch_has_kernel_for_dispatch_key` for both); tests/activations/trace/test_fake_cuda.py holds the
CUDA build's own list to it."""


def give_torch_fake_cuda() -> None:
    """Make fake CUDA tensors trace as on torch's CUDA build, on whichever build this is (once per process).

    Raises:
        UsageError: this build cannot be given torch's fake CUDA guard (a Windows CPU wheel): the CUDA build can.
    """
    import torch

    try:
        _torch.fake_cuda_device_guard()
    except _torch.FakeCudaGuardUnavailable as exc:
        raise UsageError(
            f"`device` cuda traces fake CUDA tensors, and this torch ({torch.__version__}) cannot make them: {exc}",
            f"install torch's CUDA build (no GPU needed): pip install torch --index-url {CUDA_WHEELS}; "
            "or trace for `device` cpu",
        ) from None
    if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        _cuda_kernels_for_whole_ops()


@functools.cache
def _cuda_kernels_for_whole_ops() -> Any:
    """A CUDA kernel for each op of WHOLE_ON_CUDA that has none here; the library is kept for the process's life
    (torch drops its kernels when the object dies)."""
    import torch

    library = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]

    def never_run(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("memlayout gives this op a CUDA kernel for fake CUDA tensors only; "
                                  "this torch has no CUDA kernels")

    for name in WHOLE_ON_CUDA:
        if not _torch.has_kernel_for(f"aten::{name}", "CUDA"):
            library.impl(name, never_run, "CUDA")  # type: ignore[no-untyped-call]
    return library


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

    @staticmethod
    @contextlib.contextmanager
    def building() -> Iterator[None]:
        """Around building the model on fake CUDA tensors: what an RNN's constructor warns there is not the user's.

        `RNNBase.__init__` lays its weights out for cuDNN (`flatten_parameters`): the CPU wheel warns "PyTorch was
        compiled without cuDNN/MIOpen support", the CUDA build that the data pointer of a FakeTensor was read. The
        model is refused afterwards (`refuse_what_no_build_traces`), in one line.
        """
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="PyTorch was compiled without cuDNN", category=UserWarning)
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor", category=UserWarning)
            yield

    def refuse_what_no_build_traces(self, model: Any) -> None:
        """Refuse, before tracing, a model with a module that no torch build runs on fake CUDA tensors without a GPU.

        cuDNN's RNNs: torch's CUDA build runs cuDNN's own kernels for them (`_cudnn_rnn`,
        `_cudnn_rnn_flatten_weight`) on fake tensors, which stop without a GPU ("CUDA driver version is
        insufficient", 2.14.1+cu130), and a build without cuDNN would split them into ops no GPU runs.

        Raises:
            UsageError: naming the first such module, and what answers instead.
        """
        import torch

        for path, module in model.named_modules():
            if isinstance(module, torch.nn.RNNBase):
                cpu = "`device=cpu` predicts the CPU's step" if self.assumed else "drop `gpu` to predict the CPU's step"
                raise UsageError(
                    f"{type(module).__name__} ({path or 'the model'}) runs cuDNN's RNN kernels on a GPU, which are not "
                    f"traced for {self.gpu.key} without one",
                    f"{cpu} (oneDNN's kernels); on the GPU itself, `real` `device=cuda` measures it",
                )

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

