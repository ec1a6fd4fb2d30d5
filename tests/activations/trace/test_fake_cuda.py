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
from tests.activations import models

pytestmark = pytest.mark.cuda_build

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
    # The reason gpu_free_backward.py exists: if a torch release fixes it, that loop can go.
    with _torch.FakeTensorMode():
        weight = torch.empty(4, 4, device="cuda", requires_grad=True)
        loss = (weight * 2).sum()
        with pytest.raises(RuntimeError, match="hasPrimaryContext expects a valid device index"):
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
