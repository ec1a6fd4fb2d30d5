"""Build the model a TARGET names on tensors without memory, whatever its `__init__` does.

Memory does not depend on a weight's values, but building a model can: an
`__init__` that reads a value (`torch.linspace(0, rate, depth).tolist()` for
drop-path rates, an init bound computed with `.item()`) fails under
FakeTensorMode, whose tensors have none. The user's factory is never to blame
for that, so building goes in two ways:

1. everything on fake (or meta) tensors: no memory at all, ties kept as built;
2. if that fails, everything real except the parameters, which move to the meta
   device as each is registered, so that their initialisers run on no memory
   (torch's own `trunc_normal_` reads values on fake tensors, and returns at once
   on meta ones); when the build returns, parameters and buffers move to the
   step's tensors (buffers stay real until then, so `__init__` can read them). A
   parameter assigned to two modules is one Parameter object, moved once: tied
   weights stay one storage.

When both fail, the message names the op that needed a value and the line of
the model's code that ran it.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from memlayout import _torch
from memlayout.activations.model.parameter_class import moved_parameter
from memlayout.activations.model.target import ModelSource, TargetKind, checked_model, model_source
from memlayout.activations.request.step_request import ModelTarget
from memlayout.errors import MemlayoutError, UsageError

_GLOSS = {
    "aten._local_scalar_dense.default": ".item(), .tolist(), float() or bool() of a tensor",
    "aten.nonzero.default": "an output whose size depends on values: nonzero, a boolean mask",
}
HINT = (
    "pass --real to build the model and run the step for real (it takes the memory), or build it yourself and give "
    "it to memlayout.activations.analyze(model, ...), which copies it onto fake tensors"
)


@dataclass(frozen=True)
class Built:
    model: Any
    kind: TargetKind
    notes: tuple[str, ...]
    class_chosen_by: str = ""
    """Why the model is of its class (`ModelSource.class_chosen_by`)."""


@dataclass(frozen=True)
class ValueRead:
    """An op that needed a tensor's value while building, and where the model's code ran it."""

    op: str
    where: str

    def describe(self) -> str:
        gloss = _GLOSS.get(self.op)
        return f"{self.op}{f' ({gloss})' if gloss else ''} at {self.where}"


class TensorMover:
    """Re-creates tensors in another world (meta or fake): same shapes, dtypes and strides, no values.

    Tensors that shared a storage share one again, and a Parameter is moved once, so a
    weight tied by assigning one Parameter to two modules stays one storage (storage
    objects are compared by identity: meta ones all report data pointer 0).
    """

    def __init__(
        self, world: str, device: str, context: Callable[[], AbstractContextManager[Any]], dtype: Any = None
    ) -> None:
        self.world = world
        """"fake" or "meta"."""
        self.device = "meta" if world == "meta" else device
        self.context = context
        self.dtype = dtype
        """The dtype floating tensors are cast to (`--dtype`); None keeps each tensor's."""
        self._moved_parameters: dict[int, tuple[Any, Any]] = {}
        """id(source) -> (source, moved); the source is kept so that its id is not reused."""
        self._storages: dict[int, tuple[Any, Any]] = {}

    def holds(self, tensor: Any) -> bool:
        if self._new_dtype(tensor) != tensor.dtype:
            return False
        if self.world == "meta":
            return bool(tensor.is_meta)
        # A fake tensor on another device (a model adopted on the CPU, traced for CUDA) is moved.
        return isinstance(tensor, _torch.FakeTensor) and tensor.device.type == self.device.split(":")[0]

    def move(self, tensor: Any) -> Any:
        import torch
        from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

        if self.holds(tensor) or isinstance(tensor, (UninitializedParameter, UninitializedBuffer)):
            return tensor  # a lazy module's parameter has no shape until its first forward
        if not isinstance(tensor, torch.nn.Parameter):
            return self._data(tensor)
        known = self._moved_parameters.get(id(tensor))
        if known is None:
            moved = torch.nn.Parameter(self._data(tensor), requires_grad=tensor.requires_grad)
            # A Parameter subclass (bitsandbytes' quantized weights) stays one, its state moved along with it.
            moved = moved_parameter(tensor, moved, self._attribute)
            known = (tensor, moved)
            self._moved_parameters[id(tensor)] = known
        return known[1]

    def _attribute(self, tensor: Any) -> Any:
        """A tensor a parameter keeps in an attribute (a quantization state's absmax): moved, in its own dtype."""
        dtype, self.dtype = self.dtype, None
        try:
            return tensor if self.holds(tensor) else self._data(tensor)
        finally:
            self.dtype = dtype

    def _new_dtype(self, tensor: Any) -> Any:
        return self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype

    def _data(self, tensor: Any) -> Any:
        import torch

        dtype = self._new_dtype(tensor)
        with self.context():
            if tensor.layout != torch.strided:
                return torch.empty_like(tensor, device=self.device, dtype=dtype)
            storage = tensor.untyped_storage()
            known = self._storages.get(id(storage))
            if known is None:
                # Offsets and strides count elements, so a cast storage keeps them with
                # its bytes scaled by the itemsizes (as `.to(dtype)` of every view would).
                nbytes = storage.nbytes() // tensor.element_size() * dtype.itemsize
                moved = torch.empty((nbytes,), dtype=torch.uint8, device=self.device).untyped_storage()
                known = (storage, moved)
                self._storages[id(storage)] = known
            empty = torch.empty((0,), dtype=dtype, device=self.device)
            return empty.set_(known[1], tensor.storage_offset(), tensor.shape, tensor.stride())

    def move_model(self, model: Any) -> None:
        """Move, in place, every parameter and buffer of the model that is not in this world yet."""
        for module in model.modules():
            for store in _torch.module_tensor_slots(module):
                for name, tensor in list(store.items()):
                    if tensor is not None:
                        store[name] = self.move(tensor)


def cast_model(model: Any, dtype: Any, world: str, device: str,
               context: Callable[[], AbstractContextManager[Any]]) -> None:
    """Cast the model's floating parameters and buffers to `dtype` in place, as `model.to(dtype)` does (`--dtype`).

    Real tensors go through `Module.to`; fake and meta ones are re-made in their
    world, for the reason `place_fake_model` gives.
    """
    if world == "real":
        model.to(dtype)
    else:
        TensorMover(world, device, context, dtype=dtype).move_model(model)


def place_fake_model(model: Any, device: str, context: Callable[[], AbstractContextManager[Any]]) -> list[str]:
    """Put a fake model's parameters and buffers on `device`, as `model.to(device)` would, and say what could not
    follow.

    `Module._apply` swaps each fake parameter for its moved copy (`torch.utils.swap_tensors`),
    which refuses a tensor that something holds a weak reference to, and the fake mode
    does: `.to("cuda")` stopped with "_apply(): Couldn't swap Embedding.weight" (torch 2.11
    on an H200, and 2.14.1+cu130 without a GPU). The moved tensors are put in the modules'
    slots instead, ties kept. `RNNBase._apply` then lays each RNN's weights out for cuDNN;
    that is done here too, so that the trace sees the RNN as `.cuda()` leaves it.
    """
    import torch

    TensorMover("fake", device, context).move_model(model)
    notes = []
    for module in model.modules():
        if isinstance(module, torch.nn.RNNBase):
            _torch.refresh_rnn_flat_weights(module)
            try:
                with context():
                    module.flatten_parameters()
            except Exception as exc:  # fake kernels may lack cuDNN's flatten; the trace then copies, as cuDNN would
                notes.append(f"{type(module).__name__}: its weights could not be laid out for cuDNN on fake tensors "
                             f"({type(exc).__name__}); the trace counts the copy cuDNN makes of unflattened weights")
    return notes


@contextmanager
def parameters_moved_on_registration(mover: TensorMover) -> Iterator[None]:
    """Every `register_parameter` (and so every `module.weight = Parameter(...)`) stores the moved parameter."""
    import torch

    original = torch.nn.Module.register_parameter

    def register_parameter(module: Any, name: str, param: Any) -> None:
        original(module, name, None if param is None else mover.move(param))

    torch.nn.Module.register_parameter = register_parameter  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def build_model(
    model_target: ModelTarget,
    *,
    context: Callable[[], AbstractContextManager[Any]],
    world: str,
    device: str,
    adopt: Callable[[Any], Any],
) -> Built:
    """Build TARGET's model in the step's tensor world.

    Args:
        model_target: The TARGET string, and how to build it (trust, the main module, the transformers class).
        context: Enters the world (fake mode, default device).
        world: "fake", "meta" or "real".
        device: The step's device.
        adopt: Copies a model built elsewhere into the world.

    Raises:
        UsageError: building failed; a value read names the op and the line.
    """
    target = model_target.target
    source = model_source(model_target)
    chosen_by = source.class_chosen_by
    if source.prebuilt:
        return Built(adopt(checked_model(source.build(), target)), source.kind, (), chosen_by)
    try:
        with context():
            model = source.build()
        return Built(checked_model(model, target), source.kind, (), chosen_by)
    except MemlayoutError:
        raise
    except Exception as exc:
        if world == "real" or not source.values_free:
            raise _failed(source, exc) from exc
        first = exc
    model = _built_on_meta_parameters(source, target, first, world=world, device=device, context=context)
    first_read = value_read(first)
    cause = first_read.describe() if first_read is not None else f"{_text(first)} at {where(first)}"
    note = (
        f"the model was built with real tensors and meta parameters (each made meta as it was registered, so its "
        f"initialisers ran on no memory), then made {world}: on {world} tensors alone, building needs {cause}"
    )
    return Built(model, source.kind, (note,), chosen_by)


def _built_on_meta_parameters(source: ModelSource, target: str, first: Exception, *, world: str, device: str,
                              context: Callable[[], AbstractContextManager[Any]]) -> Any:
    """The second way to build: real tensors, each parameter made meta as it is registered, then the whole model
    moved into the step's world; for a model whose building failed in that world (`first`)."""
    first_read = value_read(first)
    try:
        with parameters_moved_on_registration(TensorMover("meta", "meta", nullcontext)):
            model = checked_model(source.build(), target)
        TensorMover(world, device, context).move_model(model)
    except MemlayoutError:
        raise
    except Exception as exc:
        read = value_read(exc)
        if read is not None:
            raise UsageError(
                f"{source.action} reads a value computed from a parameter, and parameters have no values here: "
                f"{read.describe()}",
                HINT,
            ) from exc
        if first_read is not None:
            raise UsageError(
                f"{source.action} reads a value, which {world} tensors do not have: {first_read.describe()}; "
                f"built with real tensors and meta parameters, it raised {_text(exc)} at {where(exc)}",
                HINT,
            ) from exc
        raise _failed(source, exc) from exc
    return model


def _failed(source: ModelSource, exc: BaseException) -> UsageError:
    read = value_read(exc)
    if read is not None:
        return UsageError(f"{source.action} reads a value, which this step's tensors do not have: {read.describe()}",
                          HINT)
    return UsageError(f"{source.action} raised {_text(exc)} at {where(exc)}", "rerun with --debug for the traceback")


def _text(exc: BaseException) -> str:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__


def value_read(exc: BaseException) -> ValueRead | None:
    """The op that needed a value, if that is why `exc` (or an exception it wraps) was raised."""

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (_torch.DataDependentOutputException, _torch.DynamicOutputShapeException)):
            return ValueRead(str(current.func), where(exc))
        message = str(current)
        if isinstance(current, (RuntimeError, NotImplementedError)) and (
            "meta tensor" in message and ("cannot be called" in message or "no data" in message)
        ):
            return ValueRead(message.splitlines()[0], where(exc))
        current = current.__cause__ or current.__context__
    return None


def where(exc: BaseException) -> str:
    """`file:line` (and the line) of the innermost frame of the model's code in the traceback.

    The model's code is whatever is not torch, memlayout or Python's standard library:
    the user's factory, or the modelling code of a library such as transformers.
    """
    import torch

    skipped = (
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # memlayout/
        os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
    )
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if not path.startswith(skipped) and not frame.filename.startswith("<"):
            shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
            code = f": `{frame.line.strip()}`" if frame.line else ""
            return f"{shown}:{frame.lineno} in {frame.name}{code}"
    return "an unknown line (rerun with --debug for the traceback)"
