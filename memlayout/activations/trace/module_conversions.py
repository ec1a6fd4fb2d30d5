"""A model's own `module.to(...)` inside its forward, on fake tensors.

`Module._apply`, which `.to()`, `.float()` and `.cuda()` call, swaps every fake
parameter for its converted copy with `torch.utils.swap_tensors`, whatever the
conversion (torch/nn/modules/module.py: `isinstance(param, FakeTensor)` forces the
swap). `swap_tensors` refuses a tensor that something holds a weak reference to,
and every fake Parameter has one: `nn.Parameter(fake)` detaches it, and the fake
mode's MetaConverter keeps a weak reference to the result (torch 2.13 and 2.14:
`weakref.getweakrefcount` reads 1). So on fake tensors `.to()` fails on any module,
even one built inside the fake mode: "_apply(): Couldn't swap Linear.weight".
NllbMoe's and SwitchTransformers' routers call `self.classifier.to(self.dtype)` on
every forward, and could not be traced.

A conversion that changes nothing (`.to()` of the dtype and device a tensor already
has returns the tensor itself) leaves `_apply` swapping two tensors of one storage,
offset, shape, strides and dtype; a real step does nothing there either
(`param.data = param`). That swap is skipped.

A conversion that changes something is swapped once the fake mode has forgotten which
tensor it converted into the parameter (the weak reference is its memo's:
`_torch.forget_fake_conversions`); a parameter converted to another dtype is no longer
that conversion anyway. peft moves each new adapter to its base layer's device and dtype
(`_move_adapter_to_device_of_base_layer`), and on a fake CUDA step, whose new tensors
are all fake, `--lora` with `--dtype bf16` stopped there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from memlayout import _torch


@contextmanager
def unchanged_conversions_skip_the_swap() -> Iterator[None]:
    """Within it, `torch.utils.swap_tensors` of two views of the same memory does nothing, and of fake tensors
    swaps them once the fake mode forgets its conversions into them."""
    import torch.utils

    original: Callable[[Any, Any], None] = torch.utils.swap_tensors

    def swap_tensors(first: Any, second: Any) -> None:
        if _same_view(first, second):
            return
        for tensor in (first, second):
            if isinstance(tensor, _torch.FakeTensor):
                _torch.forget_fake_conversions(tensor)
        original(first, second)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _same_view(first: Any, second: Any) -> bool:
    """Whether two tensors read the same elements of one storage, in one dtype, with one `requires_grad`."""
    import torch

    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
        return False
    return (
        first.dtype == second.dtype and first.device == second.device and first.shape == second.shape
        and first.stride() == second.stride() and first.storage_offset() == second.storage_offset()
        and first.requires_grad == second.requires_grad
        and _torch.storage_id(first.untyped_storage()) == _torch.storage_id(second.untyped_storage())
    )
