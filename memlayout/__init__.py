"""memlayout: memory-layout diagnostics for PyTorch models and checkpoints.

The public API is `inspect` (layout facts and findings); torch is imported only
when a live object or a real load needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memlayout.version import __version__

# The subpackage `memlayout.flatten` shares its name with the function below.
# Python sets a package attribute only when a submodule is first loaded, so loading
# the (torch-free, empty) subpackage now lets the function keep the name for good.
importlib.import_module("memlayout.flatten")

if TYPE_CHECKING:
    from memlayout.flatten.handle import FlatHandle
    from memlayout.pipeline.inspection import Report
    from memlayout.rules import RuleConfig


def inspect(
    target: Any,
    *,
    config: RuleConfig | None = None,
    select: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
) -> Report:
    """Inspect a model or checkpoint's memory layout.

    Args:
        target: An nn.Module, a state dict, a nested training checkpoint, a path
            to a checkpoint or model directory, or "pkg.module:callable".
        config: Rule knobs; see `memlayout.rules.RuleConfig`.
        select: Rule codes or prefixes to run (all when empty), e.g. ("ML1",).
        ignore: Rule codes or prefixes to skip.

    Returns:
        A `Report` with `facts`, `findings` and `summary`.

    Examples:
        >>> import torch, memlayout
        >>> lin = torch.nn.Linear(4, 4)
        >>> lin.weight = torch.nn.Parameter(lin.weight.t())
        >>> [f.code for f in memlayout.inspect(lin).findings]
        ['ML201']
    """
    from memlayout.pipeline.inspection import run_inspection

    return run_inspection(target, config=config, select=select, ignore=ignore)


def flatten(
    module_or_state: Any,
    *,
    device: str | None = None,
    align: int = 64,
    grads: bool = False,
    share_memory: bool = False,
    pin_memory: bool = False,
) -> FlatHandle:
    """Flatten a module, state dict or training checkpoint in place into aligned flat buffers.

    Every tensor object is kept and re-pointed into its group's buffer: ties stay
    one Parameter, optimizers stay valid, RNNs get their own cuDNN-ready buffer.
    Flattening a flat object changes nothing.

    Args:
        module_or_state: An nn.Module, a state dict or a nested checkpoint.
        device: "auto", "cpu", "cuda" or "cuda:N" to move while flattening; None keeps devices.
        align: Every slot starts at a multiple of this many bytes (a power of two).
        grads: Also give parameters a parallel flat `.grad` buffer (zero it with
            `zero_grad(set_to_none=False)` to keep it).
        share_memory: Allocate CPU buffers in shared memory (one segment for Hogwild).
        pin_memory: Allocate CPU buffers pinned (one fast host-to-device copy).

    Returns:
        A `FlatHandle`; `handle.groups[i].data` is one tensor over a whole group.

    Examples:
        >>> import torch, memlayout
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> handle = memlayout.flatten(model)
        >>> [g.label for g in handle.groups]
        ['params float32 cpu requires_grad']
    """
    from memlayout.flatten.live import flatten_object

    return flatten_object(
        module_or_state, device=device, align=align, grads=grads, share_memory=share_memory, pin_memory=pin_memory
    )


def load_flat(model: Any, path: str, *, device: str | None = None) -> FlatHandle:
    """Load a flat checkpoint into a fresh model, keeping the flat layout and the ties.

    Plain `model.load_state_dict(torch.load(path))` copies each tensor into the
    model's own scattered storages, so the flat layout is lost (and ties survive
    only if the model re-ties itself). This re-points the model's tensors at the
    checkpoint's buffers instead.

    Args:
        model: A freshly built nn.Module with the checkpoint's parameter names.
        path: A torch.save state dict written by `memlayout flatten`, or a
            safetensors file it wrote (mapped as one buffer on CPU).
        device: Where the buffers live ("cpu", "cuda", "auto"); None means CPU.

    Returns:
        A `FlatHandle` over the loaded buffers.
    """
    from memlayout.flatten.load_flat import load_flat_checkpoint

    return load_flat_checkpoint(model, path, device=device)


__all__ = ["__version__", "flatten", "inspect", "load_flat"]
