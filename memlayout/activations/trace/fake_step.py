"""What a step on fake tensors needs beyond FakeTensorMode, one dispatch mode under the tracer.

- **Values where the model reads them.** Model code branches on values that come
  from the inputs alone: transformers skips the attention mask when the padding
  mask is all ones (`padding_mask.sum() == numel`), and takes the other branch as
  soon as the mask is a fake tensor; code reads lengths with `.item()`. So an op
  whose tensor arguments are all real (the inputs, tensors made from constants,
  what was computed from them) runs for real, as long as what it makes is not
  larger than `VALUE_BYTES`: its output stays real, and the model sees the values
  the real step would. Larger outputs, and anything computed from a fake tensor
  (every parameter is one), stay fake. A fake tensor whose values follow from the
  inputs alone (a larger output, what is computed from it, an input too large to
  keep real) is remembered as such, so that a value read from it is reported as
  one the inputs decide (`ValueFromInputsError`), not one the weights decide.
- **Kernels whose fake version refuses what the real one accepts.** Some meta
  kernels check more than their CPU kernels (`torch._grouped_mm`'s refuses
  float32, which the CPU kernel runs). When a fake kernel raises, the real one runs
  on zero-filled inputs of the same shapes, dtypes and strides (zeros cost no
  memory until written: the pages are the kernel's zero page), and its output's
  metadata and storage size become the fake output's. Each such fallback is
  counted, and the report lists them. The real kernel's own error, if it also
  fails, is the one raised: it is then the model's error, not the fake kernel's.

- **Shapes that follow values the weights decide.** Which experts a token is routed
  to, and how many elements a mask keeps, have no answer without running the
  weights. The step states its assumption and, where it matters, is traced under
  the two extremes too (assumptions.py states them; `FakeStepMode.policy` picks):
  - routing: `topk`, `argmax` and `max(dim)` over a fake tensor give real indices
    spread evenly (row r picks r*k, r*k+1, ... modulo the size of the dimension):
    every expert gets the same number of tokens. Its extremes are the same
    (`least`), and every row picking the same first k (`most`: a few experts take
    every token, the most any one expert computes at once);
  - masks: `nonzero` (and the boolean indexing and `masked_select` built on it) of
    a fake tensor keeps half of its elements; the extremes keep none and all.
  - random draws: small uniform draws (`torch.rand([]) < layerdrop` skips a layer)
    come out high, so every layer runs (the most memory); the other extreme draws
    low, and every droppable layer is dropped.

The first and the routing apply on CPU only: a real tensor on the step's device is
needed, and a CUDA step is traced without one.

- **Values on a device that is not here** (`--step generate` for a GPU). `generate`
  reads values all along its loop, outside the model: which special tokens are the
  same, whether a sequence has finished. On CUDA no tensor can be real, so each small
  fake tensor of such values has a real twin on the CPU (`values_on_device`): an op
  whose every tensor has one runs on the twins too (as the CPU step runs it for real,
  up to `VALUE_BYTES`), and its fake outputs get the real ones as twins; a value read
  (`.item()`) or a shape that follows values (`nonzero`) is answered from the twins;
  the next token follows the routing assumption, as on the CPU, with a twin. Twins are
  not the step's memory: the fake tensors are, on the target device, as the real
  step's tensors are. A tensor an op without twins writes into loses its twin.
- **A small constant moved to the GPU under `torch.inference_mode`.** FakeTensorMode
  keeps the value of a tensor made from a Python constant (`torch.tensor(token,
  device="cuda")`, transformers' `generate` and its cache do it) and computes ops on it
  for real, except a `_to_copy` to a device that is not there. Under inference mode the
  mode sees `aten.to` whole instead (a CompositeImplicitAutograd op, not split there), so
  the fake mode allocated on the real device: "Found no NVIDIA driver" on torch's CUDA
  build, "Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend"
  on the CPU wheel. A move to a device is split here, as it is outside inference mode,
  so that its `_to_copy` reaches the fake mode.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import Counter
from typing import Any

import torch

from memlayout import _torch
from memlayout.activations.trace.fallback_tensors import (
    TensorMetadata,
    call_key,
    fake_from,
    tensor_metadata,
    zeros_like_metadata,
    zeros_of_fakes,
)
from memlayout.activations.trace.op_arguments import (
    aliases,
    nbytes,
    op_tensors,
    pytree_tensors,
    to_a_device,
    writes,
    written,
)
from memlayout.activations.trace.value_twins import ValueTwins

SMALL_BYTES = 1 << 20
"""Routing indices and uniform draws up to this size follow the assumptions (assumptions.py)."""
VALUE_BYTES = 64 << 20
"""Outputs of real-only ops up to this size stay real: masks, lengths, position ids.

Attention masks are the large ones: a [batch, 1, seq, seq] float32 mask is
materialized before it is cut back (Longformer and LED pad to their 512-token
window: 4 MiB at batch 4), and a step that reads a value from it needs it real.
64 MiB is that mask at batch 1 and 4096 tokens; the real step holds it too.
"""
INPUT_BYTES = 16 << 20
"""Inputs up to this size are real tensors (token ids, masks, most images); larger ones are fake."""
_VALUE_ERRORS = (_torch.DataDependentOutputException, _torch.DynamicOutputShapeException)
_ROUTING = {
    torch.ops.aten.topk.default: "routing",
    torch.ops.aten.argmax.default: "routing",
    torch.ops.aten.max.dim: "routing",
}
_UNIFORM = {torch.ops.aten.rand.default, torch.ops.aten.rand.generator, torch.ops.aten.rand_like.default,
            torch.ops.aten.uniform_.default}
_MASKS = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default, torch.ops.aten.index.Tensor}
_FAKE_LOG = "torch._subclasses.fake_tensor"


class ValueFromInputsError(RuntimeError):
    """The step read a value that follows from the inputs alone, from a tensor that is fake because some tensor on
    the way was larger than memlayout computes for real (VALUE_BYTES)."""

    def __init__(self, op: str, tensor_bytes: int) -> None:
        super().__init__(f"{op} read a value of the inputs through a fake tensor of {tensor_bytes} bytes")
        self.op = op
        self.tensor_bytes = tensor_bytes
        """The size of the tensor that went fake first on the way."""


class FakeStepMode(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Run inside a FakeTensorMode (entered after it): real values where they are cheap, fallbacks where the
    fake kernels refuse."""

    def __init__(self, fake_mode: Any, *, keep_values: bool, values_on_device: str | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.fake_mode = fake_mode
        self.keep_values = keep_values
        self.values_on_device = values_on_device
        """The device ("cuda") whose small fake tensors carry values in real twins on the CPU; None: no twins."""
        self.twins = ValueTwins(fake_mode, values_on_device)
        self.policy = "typical"
        """One of assumptions.POLICIES: how shapes that follow the weights' values are decided."""
        self.fallbacks: Counter[str] = Counter()
        """op -> how many times its real kernel stood in for the fake one."""
        self.assumed: Counter[tuple[str, str]] = Counter()
        """(op, kind of assumption) -> how many times a shape or an index was decided by ASSUMPTIONS."""
        self._fallback_outputs: dict[Any, Any] = {}
        self._log_level = 0
        self._from_inputs: dict[int, tuple[Any, int]] = {}
        """storage id -> (weakref to the storage, bytes of the tensor that went fake first) for each fake storage
        whose values follow from the inputs alone."""

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
        if func.overloadpacket is torch.ops.aten.to and to_a_device(args, kwargs):
            with self:  # its parts through this mode too: a twin follows the copy
                return func.decompose(*args, **kwargs)
        if self.values_on_device is not None:
            return self._on_device_with_values(func, args, kwargs)
        tensors = op_tensors(args, kwargs)
        fakes = [t for t in tensors if isinstance(t, _torch.FakeTensor)]
        if self.keep_values and not fakes:
            return self._with_values(func, args, kwargs)
        origin = self._origin(fakes) if self.keep_values and func not in _ROUTING else None
        assumed = self.assumed.total()
        try:
            out = self._on_fakes(func, args, kwargs, tensors)
        except _VALUE_ERRORS as needs_values:
            if origin is None:
                raise
            raise ValueFromInputsError(str(func), origin) from needs_values
        if origin is not None and self.assumed.total() == assumed:  # an assumed shape is not the inputs' doing
            self.mark_from_inputs(out, origin)
        elif self._from_inputs and writes(func):  # values the inputs alone do not decide were written in
            for tensor in written(func, args, kwargs):
                self._from_inputs.pop(_torch.storage_id(tensor.untyped_storage()), None)
        return out

    def mark_from_inputs(self, value: Any, tensor_bytes: int) -> None:
        """Remember that the fake tensors in `value` hold values that follow from the inputs alone."""
        leaves, _ = _torch.tree_flatten(value)
        for tensor in leaves:
            if not isinstance(tensor, _torch.FakeTensor):
                continue
            storage = tensor.untyped_storage()
            key = _torch.storage_id(storage)
            if key not in self._from_inputs:
                # Forgotten with the storage: a later storage may have the same id.
                ref = weakref.ref(storage, functools.partial(self._forget, key))
                self._from_inputs[key] = (ref, tensor_bytes)

    def _forget(self, key: int, _: Any) -> None:
        self._from_inputs.pop(key, None)

    def _origin(self, fakes: list[Any]) -> int | None:
        """Where every fake argument holds values of the inputs alone: the largest size that made one of them
        fake; else None."""
        found = [self._from_inputs.get(_torch.storage_id(t.untyped_storage())) for t in fakes]
        if not found or any(f is None for f in found):
            return None
        return max(f[1] for f in found if f is not None)

    def _on_fakes(self, func: Any, args: Any, kwargs: Any, tensors: list[Any]) -> Any:
        if self.keep_values and func in _ROUTING:
            return self._routed(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except _VALUE_ERRORS as needs_values:
            deciding = self._deciding(func, args, tensors)
            if deciding is not None and not isinstance(deciding, _torch.FakeTensor):
                error: Exception = needs_values  # the values it needs are real ones: the real kernel has them
                values = True
            elif isinstance(needs_values, _torch.DynamicOutputShapeException) and func in _MASKS and self._masks(
                func, args
            ):
                return self._masked(func, args, kwargs)
            else:
                raise
        except Exception as refused:
            if not any(isinstance(t, _torch.FakeTensor) for t in tensors):
                raise
            error, values = refused, False
        # Out of the except block: its traceback's frames hold the op's inputs, which would then live on.
        return self._fallback(func, args, kwargs, error, keep_values=values)

    @staticmethod
    def _deciding(func: Any, args: Any, tensors: list[Any]) -> Any:
        """The tensor whose values decide the op's output shape, where it is one argument; else a real tensor
        argument if there is one (a loss whose lengths are tensors), or None."""
        if func is torch.ops.aten.nonzero.default:
            return args[0]
        if func is torch.ops.aten.masked_select.default:
            return args[1]
        if func is torch.ops.aten.index.Tensor:
            masks = [i for i in args[1] if i is not None and i.dtype == torch.bool]
            return masks[0] if len(masks) == 1 else None
        return next((t for t in tensors if not isinstance(t, _torch.FakeTensor)), None)

    # values -----------------------------------------------------------------
    def _with_values(self, func: Any, args: Any, kwargs: Any) -> Any:
        """An op on real tensors only: real if it makes nothing large."""
        if func in _UNIFORM:
            return self._uniform(func, args, kwargs)
        if aliases(func):
            return self._real(func, args, kwargs)
        try:
            fake = func(*args, **kwargs)
        except _VALUE_ERRORS:
            return self._real(func, args, kwargs)  # its inputs are small and real: so is what it reads
        except Exception:
            return self._real(func, args, kwargs)
        made = nbytes(fake)
        if made <= VALUE_BYTES:
            return self._real(func, args, kwargs)
        self.mark_from_inputs(fake, made)
        return fake

    def _uniform(self, func: Any, args: Any, kwargs: Any) -> Any:
        """Small uniform draws decide the step (layer drop: `torch.rand([]) < p` skips a layer): they come out
        high, so everything runs, or low for the least memory (see assumptions.py)."""
        return self._drawn(func, self._real(func, args, kwargs))

    def _drawn(self, func: Any, out: Any) -> Any:
        """A real uniform draw's values, as `_uniform` says."""
        if not isinstance(out, torch.Tensor) or out.untyped_storage().nbytes() > SMALL_BYTES:
            return out
        with _torch.unset_fake_temporarily():
            if out.is_floating_point():
                high = 1.0 - torch.finfo(out.dtype).eps / 2
                out.fill_(0.0 if self.policy == "least" else high)
        self.assumed[(str(func), "random")] += 1
        return out

    # values on a device that is not here: real twins ------------------------------
    def _on_device_with_values(self, func: Any, args: Any, kwargs: Any) -> Any:
        tensors = op_tensors(args, kwargs)
        twinned = all(self.twins.of(t) is not None for t in tensors)
        if func in _ROUTING and not twinned:  # the next token, or a router's choice: assumed, with a twin
            out = self._routed(func, args, kwargs)
            if isinstance(out, (tuple, list)):
                return (out[0], self.twins.fake_twinned(out[1]))
            return self.twins.fake_twinned(out)
        if not twinned:
            out = self._on_fakes(func, args, kwargs, tensors)
            self.twins.forget_written(func, args, kwargs)
            return out
        try:
            fake = func(*args, **kwargs)
        except _VALUE_ERRORS:
            fake = None  # a value read, or a shape that follows values: the twins answer
        if fake is not None and not self._keeps_twins(func, fake):
            self.twins.forget_written(func, args, kwargs)
            return fake
        real_args = _torch.tree_map(self.twins.real_argument, (args, kwargs))
        try:
            with _torch.unset_fake_temporarily():
                real = func(*real_args[0], **real_args[1])
        except Exception:
            if fake is None:
                raise
            self.twins.forget_written(func, args, kwargs)
            return fake
        if func in _UNIFORM:
            real = self._drawn(func, real)
        if fake is None:
            if not pytree_tensors(real):
                return real  # `.item()`, `bool()`: the value itself
            fake = _torch.tree_map(self.twins.fake_twinned, real)
            return fake
        fakes, reals = pytree_tensors(fake), pytree_tensors(real)
        for made, twin in zip(fakes, reals, strict=False):
            self.twins.give(made, twin)
        return fake

    def _keeps_twins(self, func: Any, fake: Any) -> bool:
        """Whether an op's fake outputs get twins: small ones do, as a CPU step keeps small outputs real."""
        return nbytes(fake) <= VALUE_BYTES

    # data-dependent shapes ---------------------------------------------------
    def _routed(self, func: Any, args: Any, kwargs: Any) -> Any:
        """The op's fake values, and real indices chosen by the policy (see ASSUMPTIONS)."""
        out = func(*args, **kwargs)
        indices = out[1] if isinstance(out, (tuple, list)) else out
        if indices.untyped_storage().nbytes() > SMALL_BYTES:
            return out
        source = args[0]
        defaults = {a.name: a.default_value for a in _torch.op_schema(func).arguments if a.has_default_value()}
        names = [a.name for a in _torch.op_schema(func).arguments]
        given = defaults | dict(zip(names, args, strict=False)) | dict(kwargs)
        dim = given.get("dim")
        shape = tuple(int(d) for d in indices.shape)
        with _torch.unset_fake_temporarily():  # real tensors from here on: the fake mode would take them over
            if dim is None or not shape:  # argmax over the flattened tensor: one index into all of it
                chosen = self._spread((1, 1), source.numel()).reshape(shape)
            elif func is not torch.ops.aten.topk.default:
                # argmax and max(dim) pick one index per row, in a dimension they drop (or keep at size 1):
                # an index into the source's dimension `dim`, not into the indices' own.
                chosen = self._spread((indices.numel(), 1), int(source.shape[dim])).reshape(shape)
            else:
                dim = dim % len(shape)
                moved = shape[:dim] + shape[dim + 1 :] + (shape[dim],)
                rows = 1
                for d in moved[:-1]:
                    rows *= d
                chosen = self._spread((rows, moved[-1]), int(source.shape[dim])).reshape(moved)
                chosen = chosen.movedim(-1, dim).contiguous()
        self.assumed[(str(func), self.routing_kind())] += 1
        return (out[0], chosen) if isinstance(out, (tuple, list)) else chosen

    def routing_kind(self) -> str:
        """The assumption an index picked from values the weights decide follows (assumptions.py)."""
        return "routing"

    def _spread(self, rows_by_k: tuple[int, int], size: int) -> torch.Tensor:
        rows, k = rows_by_k
        with _torch.unset_fake_temporarily():
            picks = torch.arange(k, dtype=torch.int64).expand(rows, k)
            if self.policy == "most":
                return picks.clone()
            starts = torch.arange(rows, dtype=torch.int64)[:, None] * k
            return (starts + picks) % max(size, 1)

    @staticmethod
    def _masks(func: Any, args: Any) -> bool:
        """Whether this op's output size depends on a mask the way _masked knows: nonzero, masked_select, or
        indexing with one boolean mask (`x[mask]`, `x[:, mask]`)."""
        if func is not torch.ops.aten.index.Tensor:
            return True
        indices = list(args[1])
        masks = [i for i in indices if i is not None and i.dtype == torch.bool]
        others = [i for i in indices if i is not None and i.dtype != torch.bool]
        return len(masks) == 1 and not others

    def _masked(self, func: Any, args: Any, kwargs: Any) -> Any:
        """A mask of values the weights decide: as many elements kept as the policy says."""
        source = args[0]
        if func is torch.ops.aten.masked_select.default:
            elements = torch.broadcast_shapes(args[0].shape, args[1].shape).numel()  # type: ignore[no-untyped-call]
        elif func is torch.ops.aten.index.Tensor:
            mask = next(i for i in args[1] if i is not None)
            elements = mask.numel()
        else:
            elements = source.numel()
        kept = {"typical": elements // 2, "least": 0, "most": elements}[self.policy]
        self.assumed[(str(func), "mask")] += 1
        with self.fake_mode:
            if func is torch.ops.aten.masked_select.default:
                return torch.empty((kept,), dtype=source.dtype, device=source.device)
            if func is torch.ops.aten.index.Tensor:
                position = next(p for p, i in enumerate(args[1]) if i is not None)
                shape = (*source.shape[:position], kept, *source.shape[position + mask.dim() :])
                return torch.empty(shape, dtype=source.dtype, device=source.device)
            return torch.empty((kept, source.dim()), dtype=torch.int64, device=source.device)

    def _real(self, func: Any, args: Any, kwargs: Any) -> Any:
        with _torch.unset_fake_temporarily():
            return func(*args, **kwargs)

    # fallbacks ----------------------------------------------------------------
    def _fallback(self, func: Any, args: Any, kwargs: Any, refused: Exception, *, keep_values: bool) -> Any:
        """The real kernel on zeros of the same metadata; its output's metadata, on fake tensors.

        With `keep_values` the real tensor arguments keep their values (the op's output shape follows
        them: a CTC loss's lengths); only the fake ones become zeros.
        """
        if aliases(func):
            raise refused
        refused.__traceback__ = None
        key = None if keep_values else call_key(func, args, kwargs)
        made = self._fallback_outputs.get(key) if key is not None else None
        if made is None:
            # Without values, every tensor argument zero-filled, real ones too: zero offsets make a grouped
            # matmul do no work.
            zeros = _torch.tree_map(zeros_of_fakes if keep_values else zeros_like_metadata, (args, kwargs))
            with _torch.unset_fake_temporarily():
                try:
                    real = func(*zeros[0], **zeros[1])
                except Exception:
                    if keep_values:
                        raise refused from None
                    raise
            made = _torch.tree_map(tensor_metadata, real)
            if key is not None:
                self._fallback_outputs[key] = made
        self.fallbacks[str(func)] += 1
        leaves, spec = _torch.tree_flatten(made)
        with self.fake_mode:
            outputs = [fake_from(m) if isinstance(m, TensorMetadata) else m for m in leaves]
        return _torch.tree_unflatten(outputs, spec)
