"""Which kernel `F.scaled_dot_product_attention` runs on a given GPU, decided as torch decides it.

torch picks the kernel at run time from the GPU's capability and the call
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, `select_sdp_backend`): it
tries the backends in priority order and takes the first whose checks all pass.
On fake CUDA tensors without a GPU every fused backend fails its hardware check
(`at::cuda::is_available()` is false) and the math path runs: a [batch, heads, q, k]
float32 score matrix that no fused kernel ever makes. So the fake step decides here,
for the target GPU, and calls the chosen op itself (`SdpaRouting`): its fake kernel
gives the outputs the real one would (cuDNN's and flash's logsumexp, the
memory-efficient kernel's padded mask), and autograd saves what the real backward
needs.

What is followed, from sdp_utils.cpp (torch 2.14's checks; `choose_backend` names
each one):
- priority: flash, memory-efficient, math, cuDNN (`torch._C._get_sdp_priority_order`);
  cuDNN goes first on sm 9.0, 10.0 and 10.3 with cuDNN newer than 9.15
  (`check_prefer_cudnn_attention`), unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1. torch does
  that once per process, at the first attention call on such a GPU, by writing cuDNN,
  flash, memory-efficient, math into the process's order (`priority_order`), so on a
  Hopper machine the order torch reports afterwards is that one, not the user's; it
  is read as the default again before the target GPU's own preference is applied;
- each backend's switch (`torch.backends.cuda.enable_*_sdp`), and determinism for cuDNN;
- flash: no mask, head sizes equal and at most 256, sm 8.0 to 12.1, fp16 or bf16,
  causal only with as many queries as keys, grouped-query heads allowed, and no
  training with head size in (192, 224] (or above 224 with dropout) on sm 8.6, 8.9, 12.x;
- memory-efficient: sm 5.0 to 12.1, head sizes a multiple of the GEMM alignment
  (8 for fp16/bf16 and 4 for fp32 from sm 8.0), q and k of the same head size, the same
  number of heads everywhere, fp16/fp32 (and bf16 from sm 8.0);
- cuDNN: cuDNN 9 or newer, sm 8.0 to 12.1, fp16 or bf16, head sizes a multiple of 8
  and at most 128 (256 on sm 9.0 from cuDNN 9.10; 192/128 on sm 10.x), more than one
  key, no dropout with one query, grouped-query heads allowed.
Nested tensors and ROCm are not modelled.

The cuDNN version is the one this torch loads; a build without cuDNN (the CPU wheel,
macOS) takes the one torch's CUDA wheel loads (`CUDA_WHEEL_CUDNN`), so that both builds
choose alike.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memlayout import _torch
from memlayout.activations.device.gpus import GpuSpec

FLASH = "flash"
EFFICIENT = "efficient"
CUDNN = "cudnn"
MATH = "math"

_TORCH_ORDER = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN}
"""torch's SDPBackend values (torch.nn.attention.SDPBackend) -> the names here."""
CUDA_WHEEL_CUDNN = 92400
"""cuDNN 9.24.0 (`torch.backends.cudnn.version()`'s encoding: major * 10000 + minor * 100 + patch), the
nvidia-cudnn-cu13 that torch 2.14.1+cu130 pins: what a fake CUDA step assumes where this torch has no cuDNN.
tests/activations/device/test_sdpa_backend.py holds it equal to the CUDA build's own."""
DEFAULT_ORDER = (FLASH, EFFICIENT, MATH, CUDNN)
CUDNN_FIRST_ORDER = (CUDNN, FLASH, EFFICIENT, MATH)
"""The order `priority_order` writes into the process, once, where the GPU prefers cuDNN (sdp_utils.cpp)."""


@dataclass(frozen=True)
class AttentionCall:
    """What the choice reads from one call: shapes, strides, dtype and the arguments."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    last_strides: tuple[int, int, int]
    """The last dimension's stride of q, k and v."""
    dtype: str
    """"float16", "bfloat16" or "float32"."""
    has_mask: bool
    dropout: float
    is_causal: bool
    enable_gqa: bool
    requires_grad: bool


@dataclass(frozen=True)
class Switches:
    """The process's SDPA settings: which backends are on, determinism, the cuDNN version, the order."""

    enabled: frozenset[str]
    deterministic: bool
    cudnn_version: int
    order: tuple[str, ...]
    cudnn_deprioritized: bool
    present_prefers_cudnn: bool = False
    """This machine's GPU prefers cuDNN: torch may have written CUDNN_FIRST_ORDER as the order itself."""


def current_switches() -> Switches:
    """The settings torch would read now (`torch.backends.cuda.*_sdp_enabled()` and friends)."""
    import torch

    backends = torch.backends.cuda
    switch_of = {FLASH: backends.flash_sdp_enabled, EFFICIENT: backends.mem_efficient_sdp_enabled,
                 CUDNN: backends.cudnn_sdp_enabled, MATH: backends.math_sdp_enabled}
    enabled = {name for name, switch in switch_of.items() if switch()}  # type: ignore[no-untyped-call]
    cudnn_version: Any = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    cudnn_version = int(cudnn_version or CUDA_WHEEL_CUDNN)
    deprioritized = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "") in ("1", "ON", "on", "true", "TRUE", "y",
                                                                             "YES")
    present_prefers_cudnn = (bool(torch.cuda.is_available())
                             and _prefers_cudnn(torch.cuda.get_device_capability(), cudnn_version, deprioritized))
    return Switches(
        enabled=frozenset(enabled),
        deterministic=(torch.are_deterministic_algorithms_enabled()
                       and not torch.is_deterministic_algorithms_warn_only_enabled()),
        cudnn_version=cudnn_version,
        order=tuple(_TORCH_ORDER[b] for b in _torch.sdp_priority_order() if b in _TORCH_ORDER),
        cudnn_deprioritized=deprioritized,
        present_prefers_cudnn=present_prefers_cudnn,
    )


def _prefers_cudnn(capability: tuple[int, int], cudnn_version: int, deprioritized: bool) -> bool:
    """sdp_utils.cpp's `check_prefer_cudnn_attention` for a GPU of this capability."""
    major, minor = capability
    return not deprioritized and cudnn_version > 91500 and major in (9, 10) and minor in (0, 3)


def priority(gpu: GpuSpec, switches: Switches) -> tuple[str, ...]:
    """The order backends are tried in on `gpu` (sdp_utils.cpp `priority_order`, `check_prefer_cudnn_attention`)."""
    order = switches.order
    if switches.present_prefers_cudnn and order == CUDNN_FIRST_ORDER:
        # torch wrote this order itself at this machine's first attention call; the target GPU decides afresh.
        order = DEFAULT_ORDER
    if order == DEFAULT_ORDER and _prefers_cudnn(gpu.capability, switches.cudnn_version, switches.cudnn_deprioritized):
        return CUDNN_FIRST_ORDER
    return order


def choose_backend(gpu: GpuSpec, call: AttentionCall, switches: Switches) -> str:
    """The backend torch runs `call` with on `gpu`: flash, efficient, cudnn or math ("" if none may run)."""
    for backend in priority(gpu, switches):
        if backend in switches.enabled and _CHECKS[backend](gpu, call, switches):
            return backend
    return ""


def _in(capability: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= capability <= high


def _dense_ok(call: AttentionCall, *, gqa: bool) -> bool:
    """check_tensor_shapes, nonzero sequence lengths, last-dim stride 1, batch sizes and heads."""
    if not (len(call.query) == len(call.key) == len(call.value) == 4):
        return False
    if min(call.query[2], call.key[2], call.value[2]) == 0:
        return False
    if any(stride != 1 for stride, size in zip(call.last_strides, (call.query[3], call.key[3], call.value[3]),
                                               strict=True) if size != 1):
        return False
    if not (call.query[0] == call.key[0] == call.value[0]):
        return False
    q_heads, k_heads, v_heads = call.query[1], call.key[1], call.value[1]
    if q_heads == k_heads == v_heads:
        return True
    return gqa and call.enable_gqa and k_heads == v_heads and q_heads % k_heads == 0


def _flash(gpu: GpuSpec, call: AttentionCall, switches: Switches) -> bool:
    head = call.query[-1]
    if call.has_mask or not (head == call.key[-1] == call.value[-1] and head <= 256):
        return False
    if not _in(gpu.capability, (8, 0), (12, 1)):
        return False
    narrow = _in(gpu.capability, (8, 6), (8, 9)) or _in(gpu.capability, (12, 0), (12, 1))
    if call.requires_grad and narrow and (192 < head <= 224 or (head > 224 and call.dropout > 0)):
        return False
    if call.is_causal and call.query[-2] != call.key[-2]:
        return False
    if call.dtype not in ("float16", "bfloat16"):
        return False
    return _dense_ok(call, gqa=True)


def _gemm_alignment(gpu: GpuSpec, dtype: str) -> int:
    half = dtype in ("float16", "bfloat16")
    tensor_cores = gpu.capability[0] >= 8 or (gpu.capability[0] >= 7 and half)
    alignment = 4 if gpu.capability[0] >= 8 else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def _efficient(gpu: GpuSpec, call: AttentionCall, switches: Switches) -> bool:
    if not _in(gpu.capability, (5, 0), (12, 1)):
        return False
    alignment = _gemm_alignment(gpu, call.dtype)
    head, value_head = call.query[-1], call.value[-1]
    if not (head == call.key[-1] and head % alignment == 0 and value_head % alignment == 0 and head > 0
            and value_head > 0):
        return False
    if not _dense_ok(call, gqa=False):
        return False
    dtypes = ("float16", "float32", "bfloat16") if gpu.capability[0] >= 8 else ("float16", "float32")
    return call.dtype in dtypes


def _cudnn(gpu: GpuSpec, call: AttentionCall, switches: Switches) -> bool:
    version = switches.cudnn_version
    if version < 90000 or (call.dropout > 0 and 91100 < version < 91400) or switches.deterministic:
        return False
    if call.dtype not in (("float16", "bfloat16") if gpu.capability[0] >= 8 else ("float16",)):
        return False
    if not _in(gpu.capability, (8, 0), (12, 1)):
        return False
    if not _dense_ok(call, gqa=True):
        return False
    head, value_head = call.query[3], call.value[3]
    limit = 128
    if version >= 91000 and gpu.capability == (9, 0):
        limit = 256
    if version >= 91100 and gpu.capability[0] == 10 and head == 192 and value_head == 128:
        limit = 192
    if head > limit or value_head > limit or head % 8 or value_head % 8:
        return False
    return not (call.key[2] == 1 or (call.query[2] == 1 and call.dropout > 0))


def _math(gpu: GpuSpec, call: AttentionCall, switches: Switches) -> bool:
    return True


_CHECKS = {FLASH: _flash, EFFICIENT: _efficient, CUDNN: _cudnn, MATH: _math}


def attention_call(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
                   enable_gqa: bool) -> AttentionCall:
    """The record `choose_backend` reads, from the tensors of one call."""
    import torch

    return AttentionCall(
        query=tuple(query.shape), key=tuple(key.shape), value=tuple(value.shape),
        last_strides=(query.stride(-1), key.stride(-1), value.stride(-1)),
        dtype=str(query.dtype).removeprefix("torch."), has_mask=attn_mask is not None, dropout=float(dropout_p),
        is_causal=bool(is_causal), enable_gqa=bool(enable_gqa),
        requires_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)),
    )


class SdpaRouting:
    """A TorchFunctionMode that runs each `F.scaled_dot_product_attention` with the op torch runs on `gpu`."""

    def __init__(self, gpu: GpuSpec) -> None:
        self.gpu = gpu
        self.chosen: Counter[str] = Counter()
        """backend -> how many calls ran with it."""

    def mode(self) -> Any:
        import torch
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        routing = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                if func is F.scaled_dot_product_attention:
                    return routing.attend(*args, **kwargs)
                return func(*args, **kwargs)

        del torch
        return _Mode()

    def attend(self, query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        """What `F.scaled_dot_product_attention` computes on `gpu`, through the op it would run there."""
        import torch
        import torch.nn.functional as F

        if torch.is_autocast_enabled("cuda"):
            # The mode sees the call before the dispatcher does: autocast has not cast yet. CUDA's autocast
            # runs scaled_dot_product_attention in lower precision (KERNEL_CUDA(..., lower_precision_fp) in
            # aten/src/ATen/autocast_mode.cpp), casting every floating tensor argument.
            low = torch.get_autocast_dtype("cuda")
            query, key, value, attn_mask = (
                t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t
                for t in (query, key, value, attn_mask))
        call = attention_call(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        backend = choose_backend(self.gpu, call, current_switches()) if call.dtype != "float64" else MATH
        self.chosen[backend or MATH] += 1
        aten = torch.ops.aten
        if backend == CUDNN:
            return aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, call.requires_grad, dropout_p, is_causal, False, scale=scale)[0]
        if backend == FLASH:
            # attention.cpp pads the head size to a multiple of 8, with the original size's scale.
            head = query.shape[-1]
            pad = (-head) % 8
            padded = [F.pad(t, (0, pad)) if pad else t for t in (query, key, value)]
            scale = scale if scale is not None else head ** -0.5
            out = aten._scaled_dot_product_flash_attention(*padded, dropout_p, is_causal, False, scale=scale)[0]
            return out[..., :head] if pad else out
        if backend == EFFICIENT:
            bias = None if attn_mask is None else _efficient_bias(attn_mask, query, key)
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, call.requires_grad, dropout_p, is_causal, scale=scale)[0]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _efficient_bias(mask: Any, query: Any, key: Any) -> Any:
    """attention.cpp's `preprocess_mask`: a boolean mask becomes an additive one, expanded to 4-D, its last
    dimension padded to 16 elements (`pad_bias`) and sliced back: the padded copy is what the kernel reads."""
    import torch
    import torch.nn.functional as F

    if mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf")).to(query.dtype)
    mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    last = mask.shape[-1]
    if last % 16:
        mask = F.pad(mask, (0, (-last) % 16))[..., :last]
    return mask
