"""The optimizer of the training step: its state, and the memory its `step()` takes.

A training step is forward, backward and `optimizer.step()`. The optimizer's
state lives through the whole step (AdamW keeps two tensors the size of each
parameter), and its update allocates temporaries of its own. Both are traced on
the same tensors as the model (fake, meta or real), with torch's own optimizer
classes: the state and the temporaries are what `torch.optim` allocates, not a
formula for them.

The step traced is a steady-state one, as MemTracker's documentation measures
it: the state exists before forward begins, as it does from the second step of
training on. A first step, run untraced, makes it, so that only the parameters
that get a gradient have state, as in training.

The default is AdamW: it is what most training uses (transformers' Trainer and
most recipes default to it), and leaving the optimizer out understates a step by
twice the parameter bytes.
"""

from __future__ import annotations

from typing import Any

from memlayout import _torch
from memlayout.activations.request.vocabulary import DEFAULT_OPTIMIZER, OPTIMIZERS
from memlayout.errors import UsageError

__all__ = ["DEFAULT_OPTIMIZER", "OPTIMIZERS"]
LEARNING_RATE = 1e-3
SGD_MOMENTUM = 0.9
"""The usual recipe for SGD; plain SGD (no momentum) keeps no state and updates in place, as `none` counts it."""
_FOREACH_DEVICES = ("cuda", "xpu")
"""Where torch's optimizers default to their foreach kernels (torch.optim.optimizer's
`_get_foreach_kernels_supported_devices`); elsewhere they update one tensor at a time."""
IMPLEMENTATIONS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""`--optimizer-impl`, as the arguments torch's optimizers take."""

HELP = (
    "The optimizer whose state and step count in the peak: adamw (the default, as most training uses; two "
    "states per parameter), adam, sgd (momentum 0.9, one state), or none (forward and backward only; also "
    "right for plain SGD, which keeps no state)."
)


def check_optimizer(name: str) -> str:
    """The optimizer name, checked.

    Raises:
        UsageError: not one of OPTIMIZERS.
    """
    if name not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r}", f"use one of {', '.join(OPTIMIZERS)}")
    return name


def build_optimizer(model: Any, name: str, *, device: str, implementation: str | None = None) -> Any:
    """The torch optimizer `name` over the model's trainable parameters; None for "none".

    Build it in the tensor world of the model (inside the FakeTensorMode for fake
    parameters). `implementation` is for-loop, foreach or fused; None chooses as torch
    chooses for real tensors on `device` (`torch_picks_foreach`). torch would not pick
    foreach for fake tensors by itself, and the two differ in temporaries.

    Raises:
        UsageError: an unknown name.
    """
    import torch

    check_optimizer(name)
    if name == "none":
        return None
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        return None
    how: dict[str, Any] = IMPLEMENTATIONS[implementation] if implementation is not None else {
        "foreach": torch_picks_foreach(parameters, device)}
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=LEARNING_RATE, **how)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=LEARNING_RATE, **how)
    return torch.optim.SGD(parameters, lr=LEARNING_RATE, momentum=SGD_MOMENTUM, **how)


def torch_picks_foreach(tensors: list[Any], device: str) -> bool:
    """Whether torch's optimizers (and `clip_grad_norm_`, given its own devices) pick their foreach kernels for these
    tensors as real ones on `device`: on a foreach device, and for plain tensors and Parameters only.

    torch.optim.optimizer's `_default_to_fused_or_foreach` checks `type(p)` against `[Tensor, Parameter]`:
    the DTensors FSDP2 and tensor parallel make (an FSDP2 parameter's type is DTensor) take the for-loop, on
    CUDA too. A fake tensor stands for a plain one.
    """
    import sys

    import torch

    if torch.device(device).type not in _FOREACH_DEVICES:
        return False
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no tensor can be a DTensor
    return dtensor is None or not any(isinstance(t, dtensor.DTensor) for t in tensors)


def state_tensors(optimizer: Any) -> list[Any]:
    """Every tensor the optimizer keeps between steps."""
    import torch

    if optimizer is None:
        return []
    return [value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)]


def state_dtype(optimizer: Any) -> str | None:
    """The dtype of the optimizer's per-parameter state (torch's name: bfloat16, float32), read off its tensors.

    torch's Adam, AdamW and SGD make each state tensor `zeros_like` its parameter
    (`torch.optim.adamw`, `_init_group`), so a bf16 model's state is bf16: none of
    them keeps float32 copies. Adam's `step` counter is left out: it is a float32
    scalar whatever the parameters are. "mixed" when parameters of several dtypes
    give state of several; None when there is no state.
    """
    import torch

    if optimizer is None:
        return None
    found = {
        str(value.dtype).removeprefix("torch.")
        for state in optimizer.state.values() for name, value in state.items()
        if isinstance(value, torch.Tensor) and name != "step"
    }
    if not found:
        return None
    return found.pop() if len(found) == 1 else "mixed"


def state_bytes_after_a_step(parameters: list[Any], name: str) -> list[int]:
    """Bytes of the state torch's optimizer `name` keeps for each of these parameters from its first step on.

    The parameters are given gradients and the optimizer steps once, so the state is
    what `torch.optim` makes (AdamW: `exp_avg` and `exp_avg_sq` like each parameter, and
    a float32 `step` scalar), each distinct storage once. On meta parameters nothing is
    allocated but the step counters (4 bytes each, on the CPU, as torch keeps them
    unless the optimizer is fused or capturable).

    Returns:
        One figure per parameter, in order; 0 for one that does not require grad.
    """
    import torch

    trainable = [p for p in parameters if p.requires_grad]
    for parameter in trainable:
        parameter.grad = torch.zeros_like(parameter)
    optimizer = build_optimizer(torch.nn.ParameterList(trainable), name, device="cpu")
    if optimizer is None:
        return [0] * len(parameters)
    optimizer.step()

    def held(parameter: Any) -> int:
        tensors = [v for v in optimizer.state.get(parameter, {}).values() if isinstance(v, torch.Tensor)]
        return sum({_torch.storage_id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())

    return [held(p) if p.requires_grad else 0 for p in parameters]
