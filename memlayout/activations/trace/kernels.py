"""What fake and meta kernels do not say about the real ones: workspace sizes and FLOPs.

Meta kernels give every output its true shape, except where the real kernel's
size depends on the library behind it. The one that matters for training on CPU
is oneDNN's LSTM (`aten.mkldnn_rnn_layer`): its training workspace, saved for
backward, is larger than the layer's output, and its meta kernel returns it
empty. The size below follows oneDNN's `set_conf`/`set_offsets` (rnn_utils):
seven regions, each starting on a 4096-byte page, with leading dimensions
rounded to 64 bytes and moved off multiples of 256 elements. A test compares it
with the real kernel's workspace over a grid of shapes.

FLOPs come from `torch.utils.flop_counter`'s registry (matmuls, convolutions,
attention; element-wise ops count 0, as FlopCounterMode counts them).

Whether a seeded op draws random numbers is read off its schema here too: a
dropout probability of 0, or `train=False`, means it draws none. Such a dropout
returns its input tensor itself from ATen's kernel (`_dropout_impl` in
Dropout.cpp); torch's Python decomposition, which fake tensors run, returned a
copy before torch 2.14 (`dropout` in torch/_decomp/decompositions.py,
`input.clone()`) and returns the input from 2.14. The op reaches the trace whole
only under `torch.inference_mode` (`--step inference`, where the model is in eval
mode), and there the copy would be a storage the real forward never has.
"""

from __future__ import annotations

import functools
from typing import Any

from memlayout import _torch

_PAGE = 4096


@functools.cache
def _flops() -> dict[Any, Any]:
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop, sdpa_flop

    formulas: dict[Any, Any] = dict(flop_registry)
    flash, flash_backward = _torch.cpu_flash_attention_op(), _torch.cpu_flash_attention_backward_op()
    # CPU's fused attention is not in the registry; its FLOPs are those of any SDPA (the backward's arguments
    # begin grad_out, query, key, value, as the registered backward formula reads them).
    if flash is not None:
        formulas[flash] = sdpa_flop
    if flash_backward is not None:
        formulas[flash_backward] = sdpa_backward_flop
    # Under torch.inference_mode (--step inference and generate) CompositeImplicitAutograd ops reach the tracer
    # whole, before they become the mm, bmm and attention kernels the registry counts: linear, matmul and SDPA are
    # counted as those are.
    import torch

    formulas[torch.ops.aten.linear] = _contraction_flop
    formulas[torch.ops.aten.matmul] = _contraction_flop
    formulas[torch.ops.aten.scaled_dot_product_attention] = sdpa_flop
    return formulas


def _contraction_flop(first: Any, second: Any, *_: Any, out_val: Any = None, **__: Any) -> int:
    """2 x each output element x the contracted size (the first argument's last dimension): linear, matmul."""
    return 2 * int(out_val.numel()) * int(first.shape[-1])


def _good_leading_dimension(dim: int, itemsize: int) -> int:
    per_line = 64 // itemsize
    ld = -(-dim // per_line) * per_line
    return ld + per_line if ld % 256 == 0 else ld


def onednn_lstm_workspace_bytes(steps: int, batch: int, input_size: int, hidden_size: int) -> int:
    """Bytes of the workspace oneDNN's float32 LSTM keeps for backward, for one layer and direction."""
    itemsize = 4
    states = (1 + 1) * (steps + 1) * batch
    regions = (
        steps * batch * _good_leading_dimension(4 * hidden_size, itemsize) * itemsize,  # gates
        steps * batch * _good_leading_dimension(hidden_size, itemsize) * itemsize,  # ht
        states * _good_leading_dimension(max(hidden_size, input_size), itemsize) * itemsize,  # states
        states * hidden_size * 4,  # c states
        states * _good_leading_dimension(max(input_size, hidden_size), 4) * 4,  # diff states (layer)
        states * _good_leading_dimension(max(input_size, hidden_size), 4) * 4,  # diff states (iter)
        states * hidden_size * 4,  # diff c states
        0,  # grid (GRU only)
    )
    offset = 0
    for size in regions:
        offset = -(-offset // _PAGE) * _PAGE + size
    return offset


def _mkldnn_rnn_layer(args: Any, kwargs: Any) -> dict[int, int] | None:
    names = (
        "input", "w0", "w1", "w2", "w3", "hx_", "cx_", "reverse", "batch_sizes", "mode", "hidden_size",
        "num_layers", "has_biases", "bidirectional", "batch_first", "train",
    )
    import torch

    values = dict(zip(names, args, strict=False)) | dict(kwargs)
    source = values["input"]
    if not values.get("train") or source.dtype != torch.float32:
        return None
    # ATen transposes a batch-first input before this op, whatever `batch_first` says.
    steps, batch = source.shape[0], source.shape[1]
    workspace = onednn_lstm_workspace_bytes(int(steps), int(batch), int(source.shape[-1]), int(values["hidden_size"]))
    return {3: workspace}


@functools.cache
def _corrections() -> dict[Any, Any]:
    import torch

    corrections: dict[Any, Any] = {}
    if hasattr(torch.ops.aten, "mkldnn_rnn_layer"):
        corrections[torch.ops.aten.mkldnn_rnn_layer.default] = _mkldnn_rnn_layer
    return corrections


def corrected_output_nbytes(func: Any, args: Any, kwargs: Any) -> dict[int, int] | None:
    """Output position -> the storage bytes the real kernel allocates, where the meta kernel differs."""
    correction = _corrections().get(func)
    return correction(args, kwargs) if correction is not None else None


def forward_flops(func: Any, args: Any, kwargs: Any, out: Any) -> int:
    """FLOPs of one op by torch's flop counter formulas; 0 for ops it does not count."""
    formula = _flops().get(func.overloadpacket)
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not fit an unusual call counts nothing rather than failing the trace
        return 0


def moved_bytes(values: Any) -> tuple[int, Any]:
    """The bytes an op reads and writes (every tensor among its arguments and outputs, whole), and the dtype of
    its first floating tensor (None without one): the memory side of its roofline (device/roofline.py).

    A walk of tuples, lists and dicts by hand: pytree costs more than the op's fake kernel here.
    """
    import torch

    total = 0
    dtype = None
    stack = [values]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
            if dtype is None and value.is_floating_point():
                dtype = value.dtype
        elif isinstance(value, (tuple, list)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return total, dtype


_DROPOUTS = frozenset({"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})


def returns_its_input(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether the real kernel returns its first argument itself where the fake one copies it: a dropout that
    draws nothing (see the module's doc)."""
    packet = func.overloadpacket
    return (getattr(packet, "__name__", "") in _DROPOUTS and func._overloadname == "default"
            and not draws_random_numbers(func, args, kwargs))


def draws_random_numbers(func: Any, args: Any, kwargs: Any) -> bool:
    """A seeded op draws unless its dropout probability is 0 or it is told it is not training
    (attention kernels are seeded for their dropout_p, and Llama's is 0)."""
    for position, argument in enumerate(_torch.op_schema(func).arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name, argument.default_value)
        if argument.name in ("p", "dropout_p") and isinstance(value, (int, float)) and value == 0:
            return False
        if argument.name == "train" and value is False:
            return False
    return True


def waits_in_place(func: Any) -> bool:
    """A collective's wait (`_c10d_functional.wait_tensor`): in eager it returns the tensor it waited on, where its
    fake kernel makes a new one (torch's MemTracker corrects it the same way)."""
    return str(func) == "_c10d_functional.wait_tensor.default"
