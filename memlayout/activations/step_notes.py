"""What a step's report says about how the step was traced: its loss, meta tensors, the optimizer's dtype, fake CUDA."""

from __future__ import annotations

from typing import Any

from memlayout.activations.facts import Trace
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.step.run import LOSS_FROM_SUM
from memlayout.activations.trace.world import StepWorld


def step_notes(request: StepRequest, step: StepWorld, baseline: Trace) -> list[str]:
    """What the report says about how the step was traced: its loss, meta tensors, the optimizer's dtype, fake CUDA."""
    notes = []
    if baseline.loss == LOSS_FROM_SUM:
        notes.append(
            "the output has no loss, so backward starts from the sum of its floating outputs; a real loss "
            "(e.g. labels=... for a Hugging Face model) adds its own temporaries"
        )
    if step.mode == "meta":
        notes.append(
            "meta tensors have no device: kernels a device chooses (oneDNN's LSTM on CPU, fused attention) are "
            "not the ones traced; --device cpu or cuda traces those"
        )
    optimizer = request.step_optimizer
    if request.dtype in ("bf16", "fp16") and optimizer != "none":
        notes.append(optimizer_dtype_note(step.model, optimizer))
    if step.fake_cuda is not None:
        notes.append(step.fake_cuda.note())
    return notes


def optimizer_dtype_note(model: Any, optimizer: str) -> str:
    """The dtype of the optimizer's state: its trainable parameters' (each state tensor is zeros_like its parameter).

    With `--dtype bf16` that is bf16, except where the trainable parameters stay in float32: peft keeps LoRA's
    adapters in float32, and so the state of their optimizer.
    """
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32"}
    dtypes = sorted({names.get(p.dtype, str(p.dtype).removeprefix("torch.")) for p in model.parameters()
                     if p.requires_grad}) if model is not None else []
    state = " and ".join(dtypes) or "none"
    more = ("; an optimizer that keeps float32 master weights or state needs more" if dtypes != ["float32"]
            else "")
    return (f"the optimizer's state is {state}, the dtype of the parameters it trains (torch's {optimizer} makes "
            f"each state tensor zeros_like its parameter){more}")
