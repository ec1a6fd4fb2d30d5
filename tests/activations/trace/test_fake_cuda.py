"""`--device cuda` on torch's CUDA build without a GPU (fake_cuda.py), against what the same code gave on an H200.

benchmarks/results/gpu/probe-h200.json holds memlayout's fake-CUDA prediction of each
step as it ran on a real H200 (torch 2.11.0+cu130, where torch's own engine and kernel
choice ran), beside the measured step. Here, with no GPU, memlayout's backward loop and
attention choice stand in for them; the prediction must be the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import memlayout.activations as act
from memlayout import _torch
from memlayout.activations.step import gpu_free_backward
from memlayout.activations.trace.fake_cuda import give_torch_fake_cuda
from tests.activations import models

PROBE = json.loads((Path(__file__).resolve().parents[3] / "benchmarks/results/gpu/probe-h200.json").read_text())
_OPTIONS = {"fp32": {}, "autocast-bf16": {"autocast": "bf16"}, "bf16": {"dtype": "bf16"}}


def _h200_row(model: str, precision: str) -> dict[str, Any]:
    return next(r for r in PROBE["steps"] if r["model"] == model and r["precision"] == precision)


def _llama_small() -> torch.nn.Module:
    """The probe's "llama-small": LlamaForCausalLM, 512 wide, 4 layers, 8 heads over 4 key/value heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=8000, max_position_embeddings=4096,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config).train()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: torch's engine runs")
def test_torchs_engine_cannot_run_backward_on_fake_cuda_tensors_without_a_gpu() -> None:
    # The reason gpu_free_backward.py exists: if a torch release fixes it, that loop can go. Each build fails in
    # its own check (gpu_free_backward.cuda_needs_it says which).
    give_torch_fake_cuda()
    refusal = ("hasPrimaryContext expects a valid device index" if torch.backends.cuda.is_built()  # type: ignore[no-untyped-call]
               else "Cannot access accelerator device when none is available")
    with _torch.FakeTensorMode():
        weight = torch.empty(4, 4, device="cuda", requires_grad=True)
        loss = (weight * 2).sum()
        with pytest.raises(RuntimeError, match=refusal):
            loss.backward()


@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16", "bf16"])
def test_gpt2_on_fake_cuda_predicts_what_it_predicted_on_the_h200(precision: str) -> None:
    (ids,), extra = models.token_inputs(8, 128, 500)
    report = act.analyze(models.gpt2(), [], kwargs={"input_ids": ids, **extra}, device="cuda",
                         **_OPTIONS[precision])  # type: ignore[arg-type]
    on_h200 = _h200_row("gpt2-tiny 8x128", precision)
    assert report.summary.peak_bytes == pytest.approx(on_h200["memlayout_fake_cuda"]["peak_bytes"], rel=0.02)
    assert report.summary.peak_bytes == pytest.approx(on_h200["step_peak_as_memlayout_counts"], rel=0.02)


def test_llama_under_bf16_autocast_on_fake_cuda_predicts_what_it_predicted_on_the_h200() -> None:
    ids = torch.randint(0, 8000, (4, 512))
    report = act.analyze(_llama_small(), [], kwargs={"input_ids": ids, "labels": ids.clone()}, device="cuda",
                         autocast="bf16")
    on_h200 = _h200_row("llama-small 4x512", "autocast-bf16")
    assert report.summary.peak_bytes == pytest.approx(on_h200["memlayout_fake_cuda"]["peak_bytes"], rel=0.02)
    # and it ran cuDNN's attention, as the H200 did (probe "sdpa": cudnn_generated_fort_native_sdpa_*); with a
    # GPU present torch itself picks the kernel on the fake CUDA tensors, and memlayout notes no choice of its own.
    if not torch.cuda.is_available():
        assert any("cudnn x" in note for note in report.notes)


def test_the_cli_traces_for_a_named_gpu_and_says_which_attention_ran() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memlayout", "activations", "tests.activations.models:gpt2", "--inputs",
         "tests.activations.models:gpt2_inputs", "--gpu", "a100-80gb", "--autocast", "bf16", "--format", "json"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["device"] == "cuda"
    note = next(n for n in report["notes"] if n.startswith("traced for"))
    assert "NVIDIA A100-SXM4-80GB (sm 8.0" in note and "flash x" in note
    # cuBLAS sizes its workspace by the GPU's capability (CublasHandlePool.cpp): the A100's, not Hopper's 32 MiB.
    from memlayout.activations.device.cuda_runtime import chosen_workspace_size

    assert report["cuda_runtime"]["cublas_workspace_bytes"] == chosen_workspace_size((8, 0), {}) < 32 << 20


def test_the_ops_a_cuda_build_runs_whole_are_the_ones_recorded() -> None:
    from memlayout.activations.trace.fake_cuda import WHOLE_ON_CUDA

    if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        pytest.skip("the CUDA build's job holds the record to its own dispatcher table")
    whole = sorted(name.removeprefix("aten::") for name in _dispatched_aten_ops()
                   if _torch.has_kernel_for(name, "CompositeImplicitAutograd") and _torch.has_kernel_for(name, "CUDA"))
    assert whole == sorted(WHOLE_ON_CUDA), "record them as fake_cuda.WHOLE_ON_CUDA"


def _dispatched_aten_ops() -> set[str]:
    """Every aten op the dispatcher knows (TorchScript's schemas name a few more, which it does not)."""
    names = {schema.name for schema in torch._C._jit_get_all_schemas() if schema.name.startswith("aten::")}
    known = set()
    for name in names:
        try:
            _torch.has_kernel_for(name, "CUDA")
        except RuntimeError:  # "operator aten::__ixor__ does not exist"
            continue
        known.add(name)
    return known


@pytest.mark.parametrize(("module", "whole"), [
    (torch.nn.SiLU(), "silu_backward"), (torch.nn.Mish(), "mish_backward"), (torch.nn.RMSNorm(8), "_fused_rms_norm"),
])
def test_every_build_runs_them_whole_on_fake_cuda_tensors(module: torch.nn.Module, whole: str) -> None:
    # Split into parts (the CPU wheel's dispatcher without the CUDA kernels), silu's backward allocated four
    # temporaries the GPU never does.
    seen: list[str] = []

    class Ops(_torch.TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    give_torch_fake_cuda()
    with _torch.FakeTensorMode(allow_non_fake_inputs=True), torch.device("cuda"):
        module = module.to("cuda")
        x = torch.randn(2, 8, requires_grad=True)
        with Ops():
            out = module(x)
        assert out.device.type == "cuda"
        if whole.endswith("_backward"):
            with Ops():
                gpu_free_backward.run_backward([out.sum()])
    assert whole in seen and "sigmoid" not in seen and "rsqrt" not in seen, seen


@pytest.mark.parametrize("flags", [["--gpu", "h100"], ["--device", "cuda"]])
def test_an_rnn_is_refused_for_a_gpu_before_tracing_and_the_hint_predicts_the_cpu(flags: list[str]) -> None:
    # torch's CUDA build runs cuDNN's RNN kernels on fake tensors and stops without a GPU ("CUDA driver version is
    # insufficient"); the CPU wheel would split the LSTM into ops no GPU runs. Both refuse, in one line, alike.
    command = [sys.executable, "-m", "memlayout", "activations", "tests.activations.models:lstm_lm",
               "--input", "int64[4,32]<500", "--format", "json"]
    refused = subprocess.run([*command, *flags], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "LSTM (lstm) runs cuDNN's RNN kernels" in refused.stderr, refused.stderr
    # The hint, followed: drop --gpu (or give --device cpu), and the CPU's step is predicted.
    followed = [*command, "--device", "cpu"] if "--device" in flags else command
    assert ("drop --gpu" if "--gpu" in flags else "--device cpu predicts") in refused.stderr
    done = subprocess.run(followed, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["device"] == "cpu"
