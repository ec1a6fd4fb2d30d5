"""One training step, as the trace and the real measurements run it.

The loss is `output.loss` when the output has one (Hugging Face models given
labels), else the sum of every floating output that requires grad. The output
is released before backward, as `loss = model(x).loss; loss.backward()` does.
With an optimizer, `optimizer.step()` follows backward; the gradients stay, as
they do until the next step's `zero_grad()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

from memlayout import _torch
from memlayout.activations.request.vocabulary import PRECISIONS, precision
from memlayout.activations.step import autograd_graph, gpu_free_backward
from memlayout.activations.step.generate import Generation, run_generate
from memlayout.activations.step.recipe import GradClip, clip_gradients
from memlayout.core.object_tree import tree_leaves
from memlayout.errors import SettingError, UsageError

LOSS_FROM_OUTPUT = "output.loss"
LOSS_FROM_SUM = "sum of floating outputs"
LOSS_NONE = "none: forward only"
"""How an inference step's "loss" reads: it has none, and no backward."""

STEP_HELP = (
    "train (the default): forward, loss, backward and --optimizer's step. inference: forward only, under "
    "torch.inference_mode with the model in eval mode: weights plus the activation peak, no gradients, no "
    "optimizer, no checkpoint plan. generate: model.generate(prompt, max_new_tokens=--new-tokens, "
    "do_sample=False) in the same mode, the prompt from --input: weights, the key/value cache and the peak's "
    "temporaries."
)


def output_tensors(output: Any) -> Iterator[Any]:
    """Every tensor in a model output: nested tuples, lists, dicts and ModelOutputs.

    Other objects (a key/value cache, a dataclass) are not looked into.
    """
    import torch

    return (leaf for leaf in tree_leaves(output, any_mapping=True) if isinstance(leaf, torch.Tensor))


def pick_loss(output: Any) -> tuple[Any, str]:
    """The scalar to call backward on, and which rule chose it.

    Raises:
        UsageError: nothing in the output can be differentiated.
    """
    import torch

    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad and loss.numel() == 1:
        return loss.reshape(()), LOSS_FROM_OUTPUT
    floats = [t for t in output_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not floats:
        raise UsageError(
            "the model's output has no floating tensor that requires grad, so there is no backward to measure",
            "return the loss (or logits) from forward, and build the model in train mode with trainable parameters",
        )
    total = floats[0].sum()
    for tensor in floats[1:]:
        total = total + tensor.sum()
    return total, LOSS_FROM_SUM


class Autocast(NamedTuple):
    """Mixed precision as `torch.autocast(device_type, dtype)` gives it, around forward and loss."""

    device_type: str
    """"cpu" or "cuda": autocast's op lists differ between the two."""
    dtype: str
    """"bf16" or "fp16"."""

    def context(self) -> AbstractContextManager[Any]:
        import torch

        if self.device_type == "cuda" and not torch.cuda.is_available():
            # Fake CUDA tensors on a machine without a GPU: torch.autocast would switch itself off.
            return _torch.cuda_autocast_without_device(torch_dtype(self.dtype))  # type: ignore[no-any-return]
        return torch.autocast(self.device_type, dtype=torch_dtype(self.dtype))


def torch_dtype(name: str) -> Any:
    """The torch dtype of a precision by either of its names: bf16 or bfloat16, fp16 or float16, fp32 or float32."""
    import torch

    short = precision(name)
    if short not in PRECISIONS:
        raise SettingError(f"unknown precision {name!r}", "use bf16, fp16 or fp32")
    return getattr(torch, PRECISIONS[short])


def give_first_gradients(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                         autocast: Autocast | None = None) -> None:
    """Forward and loss, then a zero gradient on every leaf backward would reach: what a first step's backward
    leaves for `optimizer.step()`, which makes state for the parameters that have a gradient.

    Backward itself is not run: it is the step's longest phase (about half a Llama-7B step on fake
    CUDA tensors), and which leaves get a gradient follows from the graph alone
    (`autograd_graph.leaves_reached`). A leaf that already has a gradient keeps it, as
    backward would accumulate into it.
    """
    import torch

    with autocast.context() if autocast is not None else nullcontext():
        output = model(*args, **kwargs)
        loss, _ = pick_loss(output)
        del output
    root = loss.grad_fn
    del loss
    if root is None:
        return
    for leaf in autograd_graph.leaves_reached(root):
        if leaf.grad is None:
            leaf.grad = torch.zeros_like(leaf, memory_format=torch.preserve_format)


class AfterBackward(NamedTuple):
    """What runs after backward: `clip_grad_norm_` (step/recipe.py), then the optimizer's step."""

    optimizer: Any = None
    """A torch optimizer over the model's parameters, or None."""
    clip: GradClip | None = None
    """Gradient clipping before the optimizer's step, or None."""

    def run(self, model: Any, notify: Callable[[str], None]) -> None:
        if self.clip is not None or self.optimizer is not None:
            notify("optimizer")
        if self.clip is not None:
            clip_gradients(model, self.clip)
        if self.optimizer is not None:
            self.optimizer.step()


def _backward(loss_holder: list[Any]) -> None:
    """Backward from the one loss in `loss_holder`, which is emptied so that the graph dies as backward runs."""
    if gpu_free_backward.wanted():
        # Handed over, so that the graph's nodes die as backward runs them (see gpu_free_backward.py).
        gpu_free_backward.run_backward(loss_holder)
    else:
        loss = loss_holder.pop()
        loss.backward()
        del loss


def run_step(
    model: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    on_phase: Callable[[str], None] | None = None,
    after: AfterBackward | None = None,
    autocast: Autocast | None = None,
    inference: bool = False,
    generation: Generation | None = None,
) -> tuple[Any, str]:
    """Forward, loss, backward, and the optimizer's step. Returns the detached loss and how it was picked.

    With `inference`, forward alone under `torch.inference_mode` (the caller puts the model in
    eval mode): returns the output, which stays alive as a caller's would, and LOSS_NONE.

    Args:
        model: The module, in train mode.
        args: Positional inputs.
        kwargs: Keyword inputs.
        on_phase: Called with "forward", "loss", "backward" and "optimizer" as each begins.
        after: What runs after backward: gradient clipping, then the optimizer's step; None: nothing.
        autocast: Mixed precision for forward and loss; backward runs outside it, as
            torch's autocast recipe has it (its ops run in the dtypes forward chose).
        inference: Forward only, under `torch.inference_mode`; no loss, backward or optimizer.
        generation: `model.generate` instead of one forward, under `torch.inference_mode` too
            (step/generate.py); returns the generated ids and LOSS_NONE.
    """
    notify = on_phase or (lambda _phase: None)
    notify("forward")
    if generation is not None:
        with autocast.context() if autocast is not None else nullcontext():
            return run_generate(model, args, kwargs, generation), LOSS_NONE
    if inference:
        import torch

        with torch.inference_mode(), autocast.context() if autocast is not None else nullcontext():
            return model(*args, **kwargs), LOSS_NONE
    with autocast.context() if autocast is not None else nullcontext():
        output = model(*args, **kwargs)
        notify("loss")
        loss, how = pick_loss(output)
        del output
    notify("backward")
    detached = loss.detach()
    holder = [loss]
    del loss
    _backward(holder)
    if after is not None:
        after.run(model, notify)
    return detached, how
