"""`memlayout activations TARGET --weights`: the weights in each dtype and the fixed costs of training, without inputs.

The question `accelerate estimate-memory` answers, exactly: the parameters and
buffers are counted from the model built on the meta device or from a checkpoint's
headers (model/weight_tensors.py), tied weights once, and the training columns are
what torch's own optimizer makes for them (`state_bytes_after_a_step`), not a
multiple of the weights. Activations are not counted: they depend on the batch,
and `--input` traces them.

Each row is the model in one dtype:

- float32 and float16/bfloat16: every floating parameter and buffer in that dtype,
  as `model.to(dtype)` leaves them (integer tensors keep theirs). Training keeps the
  weights, a gradient for each trainable parameter, and the optimizer's state, which
  torch keeps in the parameters' dtype: the 16-bit row is pure low-precision
  training (`--dtype bf16`). Mixed precision (`--autocast`) keeps float32 weights,
  gradients and state: the float32 row.
- int8 and int4: every floating parameter at 1 and 1/2 byte (two to a byte, rounded
  up per tensor), floating buffers in 16 bits, as a quantized model computes in:
  the weights' data alone. A quantization library adds its scales (bitsandbytes:
  absmax per block) and keeps some layers in 16 bits (the output head), which these
  rows do not guess. Quantized weights do not train, so these rows have no training
  columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memlayout.activations.model.input_specs import suggested_inputs
from memlayout.activations.model.weight_tensors import WeightSource, WeightTensor, weight_source
from memlayout.activations.request.python_call import call_request
from memlayout.activations.request.step_request import StepRequest
from memlayout.activations.request.vocabulary import Pipeline
from memlayout.activations.step.optimizer import state_bytes_after_a_step
from memlayout.dtypes import DTYPES

ROWS = (("float32", "float32", 8), ("bfloat16", "float16/bfloat16", 4), ("int8", "int8", 2), ("int4", "int4", 1))
"""(dtype, label, nibbles (half-bytes) per floating element): the rows `accelerate estimate-memory` prints."""
QUANTIZED_BUFFER_DTYPE = "bfloat16"
"""What a quantized row keeps floating buffers in: the 16-bit dtype the quantized model computes in."""


@dataclass(frozen=True)
class TrainingCost:
    """What a training step holds before its first activation: the fixed costs of training in one dtype."""

    weights_bytes: int
    """Parameters and buffers."""
    gradient_bytes: int
    """One gradient per trainable parameter, in its dtype."""
    optimizer_bytes: int
    """The optimizer's state as torch makes it (AdamW: two moments per trainable parameter and a step counter)."""

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.gradient_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class DtypeRow:
    """The model in one dtype."""

    dtype: str
    """float32, bfloat16, int8 or int4."""
    label: str
    """As the table names it: float16/bfloat16 for the 16-bit row."""
    parameter_bytes: int
    buffer_bytes: int
    training: TrainingCost | None
    """None for the quantized rows: quantized weights do not train."""

    @property
    def weights_bytes(self) -> int:
        return self.parameter_bytes + self.buffer_bytes


@dataclass(frozen=True)
class WeightsReport:
    """Everything `memlayout activations --weights` reports."""

    target: str | None
    target_kind: str
    """import-spec, hf-config, module or checkpoint."""
    format: str | None
    """The checkpoint's format (safetensors, hf-dir, torch-zip, ...); None for a model built."""
    counted_from: str
    """"the model built on the meta device" or "the checkpoint's headers"."""
    model_class: str | None
    """None for a checkpoint, which names no class."""
    class_chosen_by: str
    optimizer: str
    parameters: int
    """Elements, each distinct tensor once."""
    trainable_parameters: int
    parameter_tensors: int
    buffers: int
    buffer_tensors: int
    as_built: tuple[tuple[str, int, int], ...]
    """(dtype, elements, bytes) of the tensors as built or stored, per dtype, the most bytes first."""
    rows: tuple[DtypeRow, ...]
    suggested_inputs: tuple[str, ...]
    """`--input` specs read off a Hugging Face config (model/input_specs.py); () where there is none."""
    notes: tuple[str, ...]

    @property
    def as_built_bytes(self) -> int:
        return sum(nbytes for _, _, nbytes in self.as_built)


def weights_report(target: Any, **settings: Any) -> WeightsReport:
    """The weights in each dtype and the fixed costs of training them, without inputs (no step is traced).

    Args:
        target: An nn.Module (read, never run or copied), or a TARGET string: what `analyze` takes, and any
            checkpoint memlayout reads (a safetensors file, a torch.save file, a weights directory), local or
            remote, read from its headers.
        settings: Any setting of `StepRequest` by name: `optimizer` (adamw, the default, adam, sgd or none:
            whose state the training columns hold), `trust`, `main_module`, `model_class`, and `timeout` and
            `download` for a remote checkpoint (or `remote`, a `RemoteOptions`).

    Returns:
        A `WeightsReport`.

    Example:
        >>> report = weights_report("benchmarks/configs/llama-7b")  # doctest: +SKIP
        >>> report.rows[0].training.total_bytes  # float32 weights, gradients and AdamW's state
    """
    return predict_weights(call_request(target, None, None, Pipeline.WEIGHTS, {"weights": True, **settings}))


def predict_weights(request: StepRequest) -> WeightsReport:
    """The weights of the request's TARGET in each dtype, and the fixed costs of training them with its optimizer."""
    source = weight_source(request)
    optimizer = request.step_optimizer
    target = request.target
    tensors = source.tensors
    parameters = [t for t in tensors if not t.buffer]
    buffers = [t for t in tensors if t.buffer]
    rows = tuple(_row(dtype, label, nibbles, parameters, buffers, optimizer) for dtype, label, nibbles in ROWS)
    return WeightsReport(
        target=None if source.kind == "module" else str(target), target_kind=source.kind, format=source.format,
        counted_from=source.counted_from, model_class=source.model_class, class_chosen_by=source.class_chosen_by,
        optimizer=optimizer, parameters=sum(t.numel for t in parameters),
        trainable_parameters=sum(t.numel for t in parameters if t.trainable), parameter_tensors=len(parameters),
        buffers=sum(t.numel for t in buffers), buffer_tensors=len(buffers), as_built=_as_built(tensors), rows=rows,
        suggested_inputs=_suggested(source), notes=source.notes,
    )


def _as_built(tensors: tuple[WeightTensor, ...]) -> tuple[tuple[str, int, int], ...]:
    elements: dict[str, int] = {}
    for tensor in tensors:
        elements[tensor.dtype] = elements.get(tensor.dtype, 0) + tensor.numel
    found = [(dtype, count, count * _itemsize(dtype)) for dtype, count in elements.items()]
    return tuple(sorted(found, key=lambda item: -item[2]))


def _itemsize(dtype: str) -> int:
    return DTYPES[dtype].itemsize if dtype in DTYPES else 1


def _bytes(tensor: WeightTensor, nibbles: int) -> int:
    """The tensor's bytes with each floating element in `nibbles` half-bytes (int4 packs two to a byte, rounded up)."""
    if not tensor.floating:
        return tensor.numel * _itemsize(tensor.dtype)
    return (tensor.numel * nibbles + 1) // 2


def _row(dtype: str, label: str, nibbles: int, parameters: list[WeightTensor], buffers: list[WeightTensor],
         optimizer: str) -> DtypeRow:
    parameter_bytes = sum(_bytes(t, nibbles) for t in parameters)
    quantized = dtype in ("int8", "int4")
    buffer_nibbles = 2 * _itemsize(QUANTIZED_BUFFER_DTYPE) if quantized else nibbles
    buffer_bytes = sum(_bytes(t, buffer_nibbles) for t in buffers)
    training = None
    if not quantized:
        gradient_bytes = sum(_bytes(t, nibbles) for t in parameters if t.trainable)
        state = _optimizer_bytes(parameters, dtype, optimizer)
        training = TrainingCost(parameter_bytes + buffer_bytes, gradient_bytes, state)
    return DtypeRow(dtype, label, parameter_bytes, buffer_bytes, training)


def _optimizer_bytes(parameters: list[WeightTensor], dtype: str, optimizer: str) -> int:
    """The optimizer's state for the trainable parameters in `dtype`, made by torch's own optimizer on meta tensors.

    torch keeps each parameter's state apart, made from that parameter alone (its shape and dtype), so one
    parameter of each shape stands for the others: a 7B Llama's 291 tensors have 5 shapes, and stepping 5
    instead of 291 took 0.5 s where it took 8.
    """
    import torch

    shapes: dict[tuple[int, ...], int] = {}
    for tensor in parameters:
        if tensor.trainable:
            shapes[tensor.shape] = shapes.get(tensor.shape, 0) + 1
    made = [torch.nn.Parameter(torch.empty(shape, dtype=getattr(torch, dtype), device="meta")) for shape in shapes]
    held = state_bytes_after_a_step(made, optimizer)
    return sum(count * each for count, each in zip(shapes.values(), held, strict=True))


def _suggested(source: WeightSource) -> tuple[str, ...]:
    return tuple(spec.describe() for spec in suggested_inputs(source.model)) if source.model is not None else ()
