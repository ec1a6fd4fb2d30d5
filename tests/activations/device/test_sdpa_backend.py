"""Which attention kernel a fake CUDA step runs (sdpa_backend.py), against torch's own choices."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memlayout import _torch
from memlayout.activations.device import sdpa_backend as sb
from memlayout.activations.device.gpus import gpu_spec, spec_for_device_name
from memlayout.activations.trace.fake_cuda import give_torch_fake_cuda

PROBE = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "gpu" / "probe-h200.json"


def _switches(cudnn_version: int) -> sb.Switches:
    return sb.Switches(enabled=frozenset({sb.FLASH, sb.EFFICIENT, sb.CUDNN, sb.MATH}), deterministic=False,
                       cudnn_version=cudnn_version, order=sb.DEFAULT_ORDER, cudnn_deprioritized=False)


def _call(shape: tuple[int, ...], dtype: str, *, causal: bool = False, mask: bool = False, dropout: float = 0.0,
          kv_heads: int | None = None, grad: bool = True) -> sb.AttentionCall:
    kv = (shape[0], kv_heads or shape[1], shape[2], shape[3])
    return sb.AttentionCall(query=shape, key=kv, value=kv, last_strides=(1, 1, 1), dtype=dtype, has_mask=mask,
                            dropout=dropout, is_causal=causal, enable_gqa=kv_heads is not None, requires_grad=grad)


def _family(kernels: list[str]) -> str:
    names = " ".join(kernels).lower()
    if "cudnn" in names and "sdpa" in names:
        return sb.CUDNN
    if "fmha_cutlass" in names or "memeff" in names:
        return sb.EFFICIENT
    if "flash_fwd" in names or "flash_bwd" in names:
        return sb.FLASH
    return sb.MATH


def test_the_order_torch_reports_is_its_default_or_the_one_it_writes_on_a_gpu_that_prefers_cudnn() -> None:
    switches = sb.current_switches()
    if switches.present_prefers_cudnn:  # after this process's first attention call torch reports the cuDNN-first order
        assert switches.order in (sb.DEFAULT_ORDER, sb.CUDNN_FIRST_ORDER)
    else:
        assert switches.order == sb.DEFAULT_ORDER


def _after_torch_wrote_its_order(cudnn_version: int) -> sb.Switches:
    """The switches on a Hopper machine once torch's first attention call wrote cuDNN first into the process."""
    return dataclasses.replace(_switches(cudnn_version), order=sb.CUDNN_FIRST_ORDER, present_prefers_cudnn=True)


def test_on_a_hopper_machine_the_target_gpu_still_decides_after_torch_wrote_its_own_order() -> None:
    # Seen on an H100 (torch 2.11): once torch had run attention there, `--gpu a100-80gb` chose cuDNN, which torch
    # does not put first on an A100 (sdp_utils.cpp `priority_order` writes its cuDNN-first order into the process).
    switches = _after_torch_wrote_its_order(91900)
    call = _call((2, 8, 512, 64), "bfloat16", causal=True)
    assert sb.choose_backend(gpu_spec("a100-80gb"), call, switches) == sb.FLASH
    assert sb.choose_backend(gpu_spec("h100"), call, switches) == sb.CUDNN
    assert sb.priority(gpu_spec("a100-80gb"), switches) == sb.DEFAULT_ORDER


def test_an_order_the_user_set_is_kept_for_every_target() -> None:
    call = _call((2, 8, 512, 64), "bfloat16", causal=True)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
                                         torch.nn.attention.SDPBackend.FLASH_ATTENTION,
                                         torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
                                         torch.nn.attention.SDPBackend.MATH], set_priority=True):
        switches = sb.current_switches()
    if switches.present_prefers_cudnn:
        pytest.skip("on this GPU torch writes the same order itself: the user's choice cannot be told from it")
    assert switches.order == sb.CUDNN_FIRST_ORDER
    assert sb.choose_backend(gpu_spec("a100-80gb"), call, dataclasses.replace(switches, cudnn_version=91900)) \
        == sb.CUDNN
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
                                         torch.nn.attention.SDPBackend.FLASH_ATTENTION], set_priority=True):
        switches = dataclasses.replace(sb.current_switches(), cudnn_version=91900)
    assert sb.choose_backend(gpu_spec("h100"), call, switches) == sb.EFFICIENT
    assert sb.current_switches().order == sb.DEFAULT_ORDER  # and torch put its own back


@pytest.mark.gpu
def test_torch_writes_cudnn_first_at_its_first_attention_call_where_the_gpu_prefers_it() -> None:
    # In a fresh process: torch decides once per process (`priority_order_init_`).
    script = (
        "import json, torch\n"
        "from memlayout.activations.device import sdpa_backend as sb\n"
        "before = sb.current_switches()\n"
        "q = torch.randn(1, 2, 128, 64, device='cuda', dtype=torch.bfloat16)\n"
        "torch.nn.functional.scaled_dot_product_attention(q, q, q)\n"
        "after = sb.current_switches()\n"
        "print(json.dumps([before.order, after.order, after.present_prefers_cudnn]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[3])
    before, after, prefers = json.loads(result.stdout.strip().splitlines()[-1])
    assert tuple(before) == sb.DEFAULT_ORDER
    assert tuple(after) == (sb.CUDNN_FIRST_ORDER if prefers else sb.DEFAULT_ORDER)


def test_the_choice_on_an_h200_is_the_kernel_the_h200_ran() -> None:
    # Recorded by benchmarks/gpu/gpu_probe.py from the profiler's kernel names (torch 2.11, cuDNN 9.19).
    probe = json.loads(PROBE.read_text())
    gpu = spec_for_device_name(probe["device"]["properties"]["name"])
    assert gpu is not None
    for row in probe["sdpa"]:
        call = _call((2, 8, 1024, row["head_dim"]), row["dtype"], causal=row["causal"])
        assert (sb.choose_backend(gpu, call, _switches(probe["device"]["cudnn"]))
                == _family(row["attention_kernels"])), row


@pytest.mark.parametrize(("gpu", "dtype", "expected"), [
    ("h100", "bfloat16", sb.CUDNN),  # cuDNN first on sm 9.0 with cuDNN > 9.15
    ("a100-80gb", "bfloat16", sb.FLASH),  # flash, then memory-efficient, elsewhere
    ("a100-80gb", "float32", sb.EFFICIENT),
    ("t4", "float16", sb.EFFICIENT),  # flash needs sm 8.0
    ("t4", "bfloat16", sb.MATH),  # and the memory-efficient kernel has no bf16 before sm 8.0
    ("v100", "float32", sb.EFFICIENT),
])
def test_the_choice_follows_the_gpu(gpu: str, dtype: str, expected: str) -> None:
    assert sb.choose_backend(gpu_spec(gpu), _call((2, 8, 512, 64), dtype, causal=True), _switches(92400)) == expected


def test_each_backends_own_limits() -> None:
    a100, h100 = gpu_spec("a100-80gb"), gpu_spec("h100")
    switches = _switches(92400)
    assert sb.choose_backend(a100, _call((2, 8, 512, 64), "bfloat16", mask=True), switches) == sb.EFFICIENT
    assert sb.choose_backend(a100, _call((2, 8, 512, 64), "bfloat16", kv_heads=2), switches) == sb.FLASH
    assert sb.choose_backend(a100, _call((2, 8, 512, 288), "bfloat16"), switches) == sb.EFFICIENT  # > 256
    assert sb.choose_backend(h100, _call((2, 8, 512, 288), "bfloat16"), switches) == sb.EFFICIENT  # cuDNN: <= 256
    assert sb.choose_backend(h100, _call((2, 8, 512, 64), "bfloat16", kv_heads=2), switches) == sb.CUDNN
    assert sb.choose_backend(h100, _call((2, 8, 512, 64), "float32", kv_heads=2), switches) == sb.MATH
    older_cudnn = _switches(91400)  # cuDNN is preferred only after 9.15
    assert sb.choose_backend(h100, _call((2, 8, 512, 64), "bfloat16"), older_cudnn) == sb.FLASH


_GRID = list(itertools.product(
    (torch.bfloat16, torch.float16, torch.float32), (64, 128, 256, 96), (False, True), (False, True), (None, 2),
))


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "head", "causal", "mask", "kv_heads"), _GRID)
def test_the_choice_is_torchs_on_the_present_gpu(dtype: torch.dtype, head: int, causal: bool, mask: bool,
                                                 kv_heads: int | None) -> None:
    gpu = spec_for_device_name(torch.cuda.get_device_properties(0).name)
    if gpu is None:
        pytest.skip("the present GPU has no row in the --gpu table")
    q = torch.randn(2, 8, 256, head, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, kv_heads or 8, 256, head, device="cuda", dtype=dtype, requires_grad=True) for _ in "kv")
    attn_mask = torch.ones(256, 256, device="cuda", dtype=torch.bool).tril() if mask else None
    theirs = _torch.fused_sdp_choice(q, k, v, attn_mask, 0.0, causal and not mask, kv_heads is not None)
    call = sb.attention_call(q, k, v, attn_mask, 0.0, causal and not mask, kv_heads is not None)
    assert sb.choose_backend(gpu, call, sb.current_switches()) == {0: sb.MATH, 1: sb.FLASH, 2: sb.EFFICIENT,
                                                                   3: sb.CUDNN}[theirs]


@pytest.mark.parametrize(("gpu", "op"), [
    ("h100", "_scaled_dot_product_cudnn_attention"),
    ("a100-80gb", "_scaled_dot_product_flash_attention"),
    ("t4", "_scaled_dot_product_efficient_attention"),
])
def test_a_fake_cuda_step_runs_the_op_torch_runs_on_the_target(gpu: str, op: str) -> None:
    seen: list[str] = []

    class Ops(_torch.TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    give_torch_fake_cuda()
    routing = sb.SdpaRouting(gpu_spec(gpu))
    with _torch.FakeTensorMode(), Ops(), routing.mode():
        q, k, v = (torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.float16, requires_grad=True)
                   for _ in "qkv")
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert op in seen and "bmm" not in seen  # the fused op, not math's score matrix
    assert out.shape == q.shape and out.dtype == torch.float16


def test_the_cudnn_a_build_without_it_assumes_is_the_one_the_cuda_wheel_loads() -> None:
    # The CUDA build's job holds the record to its own cuDNN; the CPU wheel's (no cuDNN) takes the record.
    loaded = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    if loaded is not None:
        assert loaded == sb.CUDA_WHEEL_CUDNN, (
            f"torch {torch.__version__} loads cuDNN {loaded}: record it as sdpa_backend.CUDA_WHEEL_CUDNN")
    assert sb.current_switches().cudnn_version == sb.CUDA_WHEEL_CUDNN
