"""What a step on fake tensors needs beyond FakeTensorMode, one dispatch mode under the tracer.

- **Values where the model reads them.** Model code branches on values that come
  from the inputs alone: transformers skips the attention mask when the padding
  mask is all ones (`padding_mask.sum() == numel`), and takes the other branch as
  soon as the mask is a fake tensor; code reads lengths with `.item()`. So an op
  whose tensor arguments are all real (the inputs, tensors made from constants,
  what was computed from them) runs for real, as long as what it makes is small
  (`SMALL_BYTES`): its output stays real, and the model sees the values the real
  step would. Larger outputs, and anything computed from a fake tensor (every
  parameter is one), stay fake.
- **Kernels whose fake version refuses what the real one accepts.** Some meta
  kernels check more than their CPU kernels (`torch._grouped_mm`'s refuses
  float32, which the CPU kernel runs). When a fake kernel raises, the real one runs
  on zero-filled inputs of the same shapes, dtypes and strides (zeros cost no
  memory until written: the pages are the kernel's zero page), and its output's
  metadata and storage size become the fake output's. Each such fallback is
  counted, and the report lists them. The real kernel's own error, if it also
  fails, is the one raised: it is then the model's error, not the fake kernel's.

The first applies on CPU only: a real tensor on the step's device is needed, and a
CUDA step is traced without one.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

SMALL_BYTES = 1 << 20
"""Outputs of real-only ops up to this size stay real: masks, lengths, position ids, routing indices."""
INPUT_BYTES = 16 << 20
"""Inputs up to this size are real tensors (token ids, masks, most images); larger ones are fake."""
_VALUE_ERRORS = (DataDependentOutputException, DynamicOutputShapeException)
_FAKE_LOG = "torch._subclasses.fake_tensor"


def _aliases(func: Any) -> bool:
    """The op returns a view of an input or writes into one: no new memory, and it must stay with its input."""
    return any(r.alias_info is not None for r in func._schema.returns) or any(
        a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments
    )


def _nbytes(value: Any) -> int:
    leaves, _ = tree_flatten(value)
    return sum(t.untyped_storage().nbytes() for t in leaves if isinstance(t, torch.Tensor) and t.layout == torch.strided)


class FakeStepMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Run inside a FakeTensorMode (entered after it): real values where they are cheap, fallbacks where the
    fake kernels refuse."""

    def __init__(self, fake_mode: FakeTensorMode, *, keep_values: bool) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.fake_mode = fake_mode
        self.keep_values = keep_values
        self.fallbacks: Counter[str] = Counter()
        """op -> how many times its real kernel stood in for the fake one."""
        self._fallback_outputs: dict[Any, Any] = {}
        self._log_level = 0

    def __enter__(self) -> FakeStepMode:
        # The fake mode logs every kernel that raises, with a traceback, before the fallback handles it.
        log = logging.getLogger(_FAKE_LOG)
        self._log_level = log.level
        log.setLevel(logging.CRITICAL)
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        logging.getLogger(_FAKE_LOG).setLevel(self._log_level)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        if self.keep_values and not any(isinstance(t, FakeTensor) for t in tensors):
            return self._with_values(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except _VALUE_ERRORS:
            raise
        except Exception as refused:
            if not any(isinstance(t, FakeTensor) for t in tensors):
                raise
            error = refused
        # Out of the except block: its traceback's frames hold the op's inputs, which would then live on.
        return self._fallback(func, args, kwargs, error)

    # values -----------------------------------------------------------------
    def _with_values(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op on real tensors only: real if it makes nothing large."""
        if _aliases(func):
            return self._real(func, args, kwargs)
        try:
            fake = func(*args, **kwargs)
        except _VALUE_ERRORS:
            return self._real(func, args, kwargs)  # its inputs are small and real: so is what it reads
        except Exception:
            return self._real(func, args, kwargs)
        if _nbytes(fake) <= SMALL_BYTES:
            return self._real(func, args, kwargs)
        return fake

    def _real(self, func: Any, args: Any, kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return func(*args, **kwargs)

    # fallbacks ----------------------------------------------------------------
    def _fallback(self, func: Any, args: Any, kwargs: Any, refused: Exception) -> Any:
        """The real kernel on zeros of the same metadata; its output's metadata, on fake tensors."""
        if _aliases(func):
            raise refused
        refused.__traceback__ = None
        key = _signature(func, args, kwargs)
        made = self._fallback_outputs.get(key)
        if made is None:
            zeros = tree_map(_zeros_like_metadata, (args, kwargs))
            with unset_fake_temporarily():
                real = func(*zeros[0], **zeros[1])
            made = tree_map(_metadata, real)
            self._fallback_outputs[key] = made
        self.fallbacks[str(func)] += 1
        leaves, spec = tree_flatten(made)
        with self.fake_mode:
            outputs = [_fake_from(m) if isinstance(m, _TensorMetadata) else m for m in leaves]
        return tree_unflatten(outputs, spec)


class _TensorMetadata:
    __slots__ = ("device", "dtype", "offset", "shape", "storage_bytes", "stride")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape = tuple(tensor.shape)
        self.stride = tuple(tensor.stride())
        self.offset = tensor.storage_offset()
        self.dtype = tensor.dtype
        self.device = tensor.device
        self.storage_bytes = tensor.untyped_storage().nbytes()


def _metadata(value: Any) -> Any:
    return _TensorMetadata(value) if isinstance(value, torch.Tensor) else value


def _fake_from(meta: _TensorMetadata) -> torch.Tensor:
    """A fake tensor of this metadata and storage size (not with `set_`: the fake mode's dispatch cache would
    keep the storage it is given alive)."""
    made = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=meta.device)
    if meta.offset == 0 and made.untyped_storage().nbytes() == meta.storage_bytes:
        return made
    itemsize = made.element_size()
    base = torch.empty((-(-meta.storage_bytes // itemsize),), dtype=meta.dtype, device=meta.device)
    return base.as_strided(meta.shape, meta.stride, meta.offset)


def _zeros_like_metadata(value: Any) -> Any:
    """A real, zero-filled tensor with a fake one's shape, dtype and strides (other values pass through)."""
    if not isinstance(value, FakeTensor):
        return value
    with unset_fake_temporarily():
        storage_elements = value.untyped_storage().nbytes() // max(value.element_size(), 1)
        base = torch.zeros((storage_elements,), dtype=value.dtype, device=value.device)
        return base.as_strided(value.shape, value.stride(), value.storage_offset())


def _signature(func: Any, args: Any, kwargs: Any) -> Any:
    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype,
                    str(value.device))
        return value if isinstance(value, (int, float, bool, str, type(None), torch.dtype)) else repr(value)

    leaves, spec = tree_flatten((args, kwargs))
    return (func, str(spec), tuple(describe(v) for v in leaves))
