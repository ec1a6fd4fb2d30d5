"""A generate step on fake tensors: what `model.generate` needs beyond FakeStepMode (trace/fake_step.py).

- **The next token.** Greedy decoding picks it with an argmax over the last
  token's logits, in generate's own loop, outside every module of the model. On
  fake logits that is an assumption, stated apart from routing (kind "token",
  assumptions.py): row r of the batch picks token r, as routing's indices are
  spread, and the tokens stay real, so that generate's stop check reads them.
  An argmax inside a module (a router) is still routing.
- **A static cache's keys and values.** transformers allocates them with
  `torch.zeros` from no tensor, at their final length; an op on real tensors
  only runs for real (up to fake_step.VALUE_BYTES), so they would take real
  memory here, up to 64 MiB a tensor and two tensors a layer. A zero-filled or
  uninitialised tensor made from no tensor and larger than fake_step.SMALL_BYTES
  stays fake: a buffer to be written, not values the step reads.
- **Fake values written into a real tensor** (a small static cache's
  `index_copy_`): the fake mode converts the real tensor to a fake one, writes
  into that, and (answering from its dispatch cache, under inference_mode) hands
  the dispatch modes above it that copy. The real op returns the tensor it wrote
  into, and so does this mode: the tracer then sees the one storage the real step
  has, not a second one (a T5's static cache read 1.034x of the allocator's peak
  with two).
  The real tensor's own values stay as they were, which no step reads: the
  cache's keys and values reach attention, whose inputs are fake anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from memlayout import _torch
from memlayout.activations.trace.fake_step import SMALL_BYTES, FakeStepMode

_FRESH_BUFFERS = frozenset({
    torch.ops.aten.zeros.default, torch.ops.aten.empty.memory_format, torch.ops.aten.new_zeros.default,
    torch.ops.aten.new_empty.default, torch.ops.aten.zeros_like.default, torch.ops.aten.empty_like.default,
    torch.ops.aten.empty_strided.default,
})


class GenerateStepMode(FakeStepMode):  # type: ignore[no-untyped-call]
    """FakeStepMode for `model.generate` (see the module's doc)."""

    def __init__(self, fake_mode: Any, *, keep_values: bool, values_on_device: str | None = None) -> None:
        super().__init__(fake_mode, keep_values=keep_values, values_on_device=values_on_device)
        self._model_depth = 0
        """How many of the model's modules are running now: 0 in generate's own loop."""

    @contextmanager
    def watching(self, model: Any) -> Iterator[None]:
        """Know, while inside, whether an op runs in one of the model's modules or in generate's loop."""

        def enter(*_: Any) -> None:
            self._model_depth += 1

        def leave(*_: Any) -> None:
            self._model_depth -= 1

        with ExitStack() as stack:
            for module in model.modules():
                stack.enter_context(module.register_forward_pre_hook(enter))
                stack.enter_context(module.register_forward_hook(leave, always_call=True))
            self._model_depth = 0
            yield

    def routing_kind(self) -> str:
        return "token" if self._model_depth == 0 else "routing"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        written = _written_in_place(func, args, kwargs)
        if written is not None and out is not written and not isinstance(written, _torch.FakeTensor):
            return written
        return out

    def _keeps_twins(self, func: Any, fake: Any) -> bool:
        # A fresh buffer to be written (a static cache) holds no values a step reads, on any device.
        if func in _FRESH_BUFFERS and isinstance(fake, torch.Tensor) and fake.untyped_storage().nbytes() > SMALL_BYTES:
            return False
        return super()._keeps_twins(func, fake)

    def _with_values(self, func: Any, args: Any, kwargs: Any) -> Any:
        if func in _FRESH_BUFFERS:
            fake = func(*args, **kwargs)
            if isinstance(fake, torch.Tensor) and fake.untyped_storage().nbytes() > SMALL_BYTES:
                return fake
        return super()._with_values(func, args, kwargs)


def _written_in_place(func: Any, args: Any, kwargs: Any) -> Any:
    """The tensor an in-place op writes into and returns (`x.index_copy_(...)` returns x); None for other ops."""
    schema = _torch.op_schema(func)
    if len(schema.returns) != 1 or schema.returns[0].alias_info is None or not schema.returns[0].alias_info.is_write:
        return None
    first = schema.arguments[0] if schema.arguments else None
    if first is None or first.alias_info is None or not first.alias_info.is_write or not args:
        return None
    return args[0] if isinstance(args[0], torch.Tensor) else None
