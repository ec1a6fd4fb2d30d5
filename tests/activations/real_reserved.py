"""A real training step's `max_memory_reserved()` on CUDA, measured in a fresh process so that the caching allocator
starts empty, as memlayout's model of it does.

Usage: python -m tests.activations.real_reserved CASE   (prints one JSON object)

The process first makes cuBLAS's workspaces (a matmul with a bias, forward on this thread and backward on
autograd's), which memlayout states apart from the step, and counts from there: the model is built on the
GPU, then two AdamW steps run (`zero_grad(set_to_none=True)` after each), and the peaks of both steps are
read less what the workspaces took.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch

from memlayout.activations.step.run import AfterBackward, Autocast, run_step
from tests.activations import models


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                         max_position_embeddings=4096, attn_implementation="sdpa")
    return LlamaForCausalLM(config).train()


def _tokens(batch: int, length: int, vocab: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, length), generator=generator)
    return {"input_ids": ids, "labels": ids.clone()}


def gpt2_tiny() -> torch.nn.Module:
    return models.gpt2()


def llama_small() -> torch.nn.Module:
    return _llama(512, 4, 8, 4, 1376, 8000)


def llama_1b() -> torch.nn.Module:
    return _llama(2048, 16, 32, 8, 8192, 32000)


CASES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], dict[str, Any]], str | None]] = {
    "gpt2-tiny-8x128": (gpt2_tiny, lambda: _tokens(8, 128, 500), None),
    "llama-small-4x512-autocast": (llama_small, lambda: _tokens(4, 512, 8000), "bf16"),
    "llama-1b-1x2048-autocast": (llama_1b, lambda: _tokens(1, 2048, 32000), "bf16"),
}
"""name -> (model builder, keyword inputs, autocast dtype): the sizes of docs/gpu.md's H200 table. The builders
are module-level so that a prediction can name them (`tests.activations.real_reserved:llama_1b`) and build the
model on fake tensors, never 4 GiB of real ones."""


def make_workspaces() -> None:
    """cuBLAS's workspace for this thread's handle and autograd's, and cuBLASLt's (a matmul with a bias)."""
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    w = torch.randn(64, 64, device="cuda", requires_grad=True)
    b = torch.randn(64, device="cuda", requires_grad=True)
    torch.nn.functional.linear(a, w, b).sum().backward()
    torch.cuda.synchronize()


def measure(case: str) -> dict[str, Any]:
    build, inputs, autocast_dtype = CASES[case]
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    context = total - free
    allocated0 = torch.cuda.memory_allocated()
    make_workspaces()
    workspaces = torch.cuda.memory_allocated() - allocated0
    base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        model = build()
    kwargs = {k: v.cuda() for k, v in inputs().items()}
    optimizer = torch.optim.AdamW(model.parameters())
    autocast = Autocast("cuda", autocast_dtype) if autocast_dtype else None
    for _ in range(2):
        run_step(model, (), kwargs, after=AfterBackward(optimizer), autocast=autocast)
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return {
        "case": case,
        "max_memory_allocated": torch.cuda.max_memory_allocated() - base_allocated,
        "max_memory_reserved": torch.cuda.max_memory_reserved() - base_reserved,
        "workspaces_allocated": workspaces,
        "workspaces_reserved": base_reserved,
        "driver_used_after_init": context,
        "capability": list(torch.cuda.get_device_capability()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))
