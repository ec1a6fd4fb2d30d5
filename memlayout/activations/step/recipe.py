"""The training loop's own choices that a step's memory depends on: the optimizer's implementation and clipping.

torch.optim's three implementations differ in temporaries: the for-loop updates one
parameter at a time, the foreach kernels update every parameter of a dtype and device at
once (AdamW's `_multi_tensor_adamw` makes `exp_avg_sq`'s square roots for all of them
together, as big as the parameters), and the fused kernels make none. Which one runs by
default depends on the tensors (step/optimizer.py's `torch_picks_foreach`).

`clip_grad_norm_` (torch.nn.utils.clip_grad) computes every gradient's norm, their
norm, and multiplies each gradient in place: the norms are scalars, but the for-loop
and foreach paths allocate them differently, and the step runs between backward and
the optimizer, where the gradients are all alive. Its default is foreach for plain
tensors on the CPU and CUDA (`_has_foreach_support`), the for-loop for DTensors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

CLIP_FOREACH_DEVICES = ("cuda", "xpu", "cpu")
"""Where `clip_grad_norm_(foreach=None)` picks the foreach path (`_get_foreach_kernels_supported_devices()` and
the CPU, torch/utils/_foreach_utils.py's `_has_foreach_support`)."""


class GradClip(NamedTuple):
    """`clip_grad_norm_(parameters, max_norm, foreach=...)` after backward."""

    max_norm: float
    foreach: bool | None
    """True or False as `--clip-grad-impl` says; None: as torch picks it for real tensors (`clip_foreach`)."""


class Recipe(NamedTuple):
    """What the training loop chooses: the optimizer's implementation, and clipping."""

    optimizer_impl: str | None = None
    """for-loop, foreach or fused; None: as torch picks it."""
    clip: GradClip | None = None


def recipe_of(request: Any) -> Recipe:
    """The recipe a `StepRequest` asks for."""
    clip = None
    if request.clip_grad_norm is not None:
        foreach = None if request.clip_grad_impl is None else request.clip_grad_impl == "foreach"
        clip = GradClip(float(request.clip_grad_norm), foreach)
    return Recipe(request.optimizer_impl, clip)


def clip_foreach(grads: list[Any], device: str) -> bool:
    """What `clip_grad_norm_(foreach=None)` picks for these gradients as real tensors on `device`: foreach for plain
    tensors on its devices, the for-loop for DTensors (`_foreach_supported_types` is `[torch.Tensor]`)."""
    import sys

    import torch

    if torch.device(device).type not in CLIP_FOREACH_DEVICES:
        return False
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no tensor can be a DTensor
    return dtensor is None or not any(isinstance(g, dtensor.DTensor) for g in grads)


def clip_gradients(model: Any, clip: GradClip) -> None:
    """`clip_grad_norm_` over the model's parameters, with foreach as the recipe says or as torch would pick it.

    torch's own default does not apply to fake tensors (a FakeTensor is not a `torch.Tensor` by type), so it is
    decided here for the real ones they stand for.
    """
    import torch

    parameters = [p for p in model.parameters() if p.grad is not None]
    if not parameters:
        return
    foreach = clip.foreach
    if foreach is None:
        foreach = clip_foreach([p.grad for p in parameters], str(parameters[0].device))
    torch.nn.utils.clip_grad_norm_(parameters, clip.max_norm, foreach=foreach)


def recipe_words(request: Any) -> tuple[str, ...]:
    """The recipe's choices a request makes, in words, for a report's notes; () for torch's defaults alone."""
    words = []
    if request.optimizer_impl is not None:
        words.append(f"the optimizer's {request.optimizer_impl} implementation")
    if request.clip_grad_norm is not None:
        how = "" if request.clip_grad_impl is None else f", foreach={request.clip_grad_impl == 'foreach'}"
        words.append(f"clip_grad_norm_(max_norm={request.clip_grad_norm:g}{how}) before the optimizer's step")
    modules = ", ".join(request.ac_modules) if request.ac_modules else "the main blocks"
    if request.selective_ac is not None:
        words.append(f"op-level checkpointing ({request.selective_ac}) of {modules}")
    elif request.ac_modules:
        words.append(f"checkpointing of {modules}")
    if request.reshard_after_forward:
        words.append(f"reshard_after_forward {', '.join(request.reshard_after_forward)}")
    return tuple(words)
