"""Where a real CPU kernel's memory differs from its fake kernel's: output storage and scratch.

A fake (meta) kernel gives every output the storage its shape needs. Two things
the CPU allocator sees are not that:

- **Output storage larger than the shape.** `aten.mse_loss` on the CPU returns a
  0-d tensor whose storage is the whole element-wise buffer it reduced (a
  [64, 48, 192] float32 input gives a 4-byte loss holding 2,359,296 bytes).
- **Scratch.** A kernel allocates memory that no output shows and frees it before
  it returns: `mse_loss` a second buffer of the input's size, oneDNN's convolution
  backward a workspace (671,744 bytes on a small ResNet, 512 once oneDNN is off).

Which ops do this is found by measurement, not guessed: `benchmarks/accuracy/kernel_storage_probe.py`
runs every aten op of real training steps (the zoo sweep's architectures, a ResNet,
models ending in `mse_loss`) once under the allocator's events and lists those
whose real output storage or scratch differs from the fake kernel's. Those ops are
`LEARNED_OPS`.

How much is learned here, at trace time, from the real kernel: it runs on zeros
of the arguments' dtype, layout and strides (as fake_step.py's fallbacks do, zeros
cost no memory until written) at two small batch sizes, under torch.profiler with
`profile_memory=True`; the output storage and the scratch (the allocator's peak
inside the op above the outputs' new storages) are fitted linear in the input's
number of elements, the fit is checked at a third size, and applied at the op's
own size. That is an assumption: that the op's size rule is linear in its batch
(true of an element-wise buffer and of a per-sample workspace; where a fit misses
the third size, the call is measured at its own size if its arguments are at most
EXACT_BYTES and it costs at most LEARN_FLOPS, else the op keeps the fake kernel's
figures). The
learned rule is cached per op, dtype, layout, device and the arguments' shapes
less their batch dimension (a convolution's workspace follows its channels and
kernel, not only its input's size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memlayout import _torch
from memlayout.activations.model.quantize import LIBRARY_OPS_WITH_SCRATCH
from memlayout.activations.trace.kernel_calls import (
    described,
    meta_like_metadata,
    metadata_only,
    scalars,
    shape_only,
    shrunk,
    strided_tensors,
    zeros_like_metadata,
)
from memlayout.activations.trace.kernels import forward_flops, onednn_lstm_workspace_bytes
from memlayout.core.strides import dense_strides_in_order, dimension_order

LEARNED_OPS = (
    # as torch prints the overload; the ops benchmarks/accuracy/kernel_storage_probe.py found (its results file
    # benchmarks/results/kernel_storage_probe.json lists the bytes it saw, and a test keeps the two equal).
    # Composite ops (conv2d, layer_norm, lstm.input, scaled_dot_product_attention, ...) reach the trace whole
    # only under torch.inference_mode (`--step inference`), where the Autograd keys that would decompose them
    # first are off: the fake kernel shows their outputs alone, the real one also allocates what their parts do.
    "aten._ctc_loss_backward.Tensor",
    "aten._log_softmax_backward_data.default",
    "aten._native_multi_head_attention.default",
    "aten._safe_softmax.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
    "aten._transformer_encoder_layer_fwd.default",
    "aten.batch_norm.default",
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.convolution.default",
    "aten.convolution_backward.default",
    "aten.cross_entropy_loss.default",
    "aten.embedding_dense_backward.default",
    "aten.gelu_backward.default",
    "aten.group_norm.default",
    "aten.gru.input",
    "aten.layer_norm.default",
    "aten.lstm.input",
    "aten.matmul.default",
    "aten.max_pool2d.default",
    "aten.mkldnn_rnn_layer.default",
    "aten.mkldnn_rnn_layer_backward.default",
    "aten.mm.default",
    "aten.mse_loss.default",
    "aten.native_batch_norm.default",
    "aten.native_batch_norm_backward.default",
    "aten.native_layer_norm.default",
    "aten.native_layer_norm_backward.default",
    "aten.rnn_tanh.input",
    "aten.scaled_dot_product_attention.default",
)
"""The ops whose real CPU kernel allocates what its fake kernel does not show (see the module's doc). Ops of other
libraries are learned the same way: model/quantize.py's LIBRARY_OPS_WITH_SCRATCH (the probe runs aten's)."""

LAYOUT_OPS = (
    # the probe's `layout_differing`: the real kernel's output lies in memory in another order than the fake's
    "aten._log_softmax_backward_data.default",
    "aten.native_layer_norm_backward.default",
)
"""Ops whose real CPU output is laid out unlike the fake's: layer norm's backward on a transposed input (Data2VecAudio's
convolution channels) and log-softmax's on a time-major gradient (a CTC loss's) return contiguous gradients where the
fake kernels follow the input, and a convolution's backward then copies the real one (818,688 bytes of scratch on
Data2VecAudio's second convolution). The real layout is learned as the storage is, and given to the fake output."""

SHAPE_TIED_OPS = ("aten.mkldnn_rnn_layer.default", "aten.mkldnn_rnn_layer_backward.default",
                  "aten._ctc_loss_backward.Tensor", "aten.lstm.input", "aten.gru.input", "aten.rnn_tanh.input")
"""Ops whose arguments are tied by sizes the first dimension does not show (oneDNN's LSTM backward reads a
workspace laid out for the forward's sequence length; the CTC loss's log-probabilities are time-major, [T, N, C],
beside per-sample [N] lengths; a whole RNN, as `--step inference` meets it under `torch.inference_mode`, takes its
hidden state batch-second, [layers, N, H], whatever its input's layout): a smaller batch would hand the kernel
arguments it indexes out of bounds (it crashes: UniSpeechSatForCTC and ParakeetForCTC did), so these run at their
own size, on zeros, up to EXACT_BYTES of arguments."""
EXACT_BYTES = 64 << 20

SIZES = (2, 3, 4)
"""Batch sizes the real kernel runs at: two to fit the rule, the third to check it. Not batch 1: oneDNN's
convolution takes another path there (a 32-channel 3x3 convolution on 16x16 inputs: 294,912 bytes of scratch
at batch 1, then 102,400 plus 32,768 a sample from batch 2 to 8), so the fit through it missed its check on 15
of a small ResNet's 16 convolutions. A call at a batch below these is measured at its own size instead."""

LEARN_FLOPS = 1_000_000_000
"""No op is learned whose call at the largest of SIZES costs more FLOPs (torch's flop formulas) than this.
Shrinking the batch leaves an attention's sequence whole: CPU flash attention's backward on one 2,048-token
sequence of a 1.1B Llama took 15 s in float32 and 74 s in bfloat16 on a 2-core machine, to learn at most the
131,328 bytes of per-thread scratch the probe found. Such an op keeps the fake kernel's figures."""


@dataclass(frozen=True)
class KernelMemory:
    """What the real kernel allocates at one call, beyond what its fake kernel shows."""

    output_storage_bytes: tuple[int | None, ...]
    """Per output position, the real output's storage bytes (None for an output that is not a tensor)."""
    scratch_bytes: int
    """The allocator's peak inside the op above the storages of its new outputs: freed before it returns."""
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
    """Per output position, the real output's strides, where measured at this call's own shape."""
    output_orders: tuple[tuple[int, ...] | None, ...] = ()
    """Per output position, the real output's dimensions from the outermost to the innermost in memory."""

    def relaid(self, out: Any) -> Any:
        """The op's (fake) outputs, each laid out in memory as the real kernel's is where the order differs: a new
        dense tensor of the same shape and dtype in the real order."""
        import torch

        if not self.output_orders:
            return out
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        changed = False
        for position, (value, order) in enumerate(zip(flat, self.output_orders, strict=False)):
            if order is None or not isinstance(value, torch.Tensor) or value.layout != torch.strided:
                continue
            shape = tuple(int(n) for n in value.shape)
            if sorted(order) != [dim for dim, size in enumerate(shape) if size != 1]:
                continue  # measured where another set of dimensions had one element: no order to carry over
            if dimension_order(shape, tuple(int(s) for s in value.stride())) == order:
                continue
            flat[position] = torch.empty_strided(shape, dense_strides_in_order(shape, order), dtype=value.dtype,
                                                 device=value.device)
            changed = True
        if not changed:
            return out
        return type(out)(flat) if isinstance(out, (tuple, list)) else flat[0]

    def corrected_sizes(self, out: Any) -> dict[int, int]:
        """Output position -> the real storage's bytes, where they differ from the (fake) output's own."""
        import torch

        flat = out if isinstance(out, (tuple, list)) else (out,)
        return {position: real for position, (value, real) in enumerate(zip(flat, self.output_storage_bytes,
                                                                             strict=False))
                if real is not None and isinstance(value, torch.Tensor) and value.layout == torch.strided
                and value.untyped_storage().nbytes() != real}


def measure_kernel(func: Any, args: Any, kwargs: Any) -> KernelMemory:
    """Run the real kernel once on zeros of the arguments' metadata and read the allocator's events.

    Args:
        func: an aten op overload.
        args, kwargs: its arguments; tensors (real or fake) give only their shape, dtype, strides and device.

    Returns:
        The real outputs' storage bytes and the kernel's scratch.
    """
    import torch

    with _torch.disable_dispatch_modes(), _torch.unset_fake_temporarily():
        real_args, real_kwargs = _torch.tree_map(zeros_like_metadata, (args, kwargs))
        inputs = {t.untyped_storage().data_ptr() for t in strided_tensors((real_args, real_kwargs))}
        # Once first, unmeasured: oneDNN builds and caches its primitive on the first call of a kind, and a
        # training step's kernels have run in an earlier step (the steady state is what is measured).
        func(*real_args, **real_kwargs)
        out, events = _torch.cpu_allocator_events(lambda: func(*real_args, **real_kwargs))
    # A free counts only against an allocation of its size in this run: the CPU allocator reports a free by the
    # size it last recorded for the address while profiling (c10/core/CPUAllocator.cpp), which can be a stale
    # size from an earlier profile when the block itself was allocated outside one.
    open_sizes: dict[int, int] = {}
    live = peak = 0
    for _, nbytes in events:
        if nbytes > 0:
            open_sizes[nbytes] = open_sizes.get(nbytes, 0) + 1
        elif open_sizes.get(-nbytes, 0) > 0:
            open_sizes[-nbytes] -= 1
        else:
            continue
        live += nbytes
        peak = max(peak, live)
    flat = out if isinstance(out, (tuple, list)) else (out,)
    sizes: list[int | None] = []
    strides: list[tuple[int, ...] | None] = []
    new_storages: dict[int, int] = {}
    for value in flat:
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            storage = value.untyped_storage()
            sizes.append(storage.nbytes())
            strides.append(tuple(int(s) for s in value.stride()))
            if storage.data_ptr() not in inputs:
                new_storages[storage.data_ptr()] = storage.nbytes()
        else:
            sizes.append(None)
            strides.append(None)
    return KernelMemory(output_storage_bytes=tuple(sizes), scratch_bytes=max(0, peak - sum(new_storages.values())),
                        output_strides=tuple(strides),
                        output_orders=tuple(None if stride is None else dimension_order(tuple(value.shape), stride)
                                            for value, stride in zip(flat, strides, strict=True)))


def learned_kernel_memory(func: Any, args: Any, kwargs: Any, *, keeps_size: Any = None) -> KernelMemory | None:
    """The real kernel's output storage and scratch at this call, learned from small real runs; None where the op
    is not one of LEARNED_OPS, or its size rule could not be learned (the fake kernel's figures stand).

    Args:
        func: an aten op overload.
        args, kwargs: its arguments, fake or real.
        keeps_size: a predicate on a tensor argument that must keep its size when the batch shrinks (a weight
            whose first dimension happens to equal the batch); by default every tensor with the batch size as its
            first dimension shrinks.
    """
    if str(func) not in LEARNED_OPS and str(func) not in LAYOUT_OPS and str(func) not in LIBRARY_OPS_WITH_SCRATCH:
        return None
    import torch

    tensors = list(strided_tensors((args, kwargs)))
    if not tensors or tensors[0].dim() == 0 or tensors[0].device != torch.device("cpu"):
        return None
    if str(func) in SHAPE_TIED_OPS:
        return _at_own_size(func, args, kwargs, tensors)
    batch = int(tensors[0].shape[0])
    batched = tuple(t.dim() > 0 and int(t.shape[0]) == batch and not (keeps_size is not None and keeps_size(t))
                    for t in tensors)
    # oneDNN on or off changes the kernel (and its scratch) behind the same op, and the threads it runs on change its
    # per-thread scratch: both are part of the key (`_kernel_setting`).
    signature = (str(func), *_kernel_setting(),
                 *(described(t, shrinks) for t, shrinks in zip(tensors, batched, strict=True)),
                 scalars(args, kwargs))
    if batch < SIZES[0]:
        return _measured_at(batch, signature, func, _torch.tree_map(metadata_only, (args, kwargs)), batched)
    metadata = _torch.tree_map(metadata_only, (args, kwargs))
    rule = _learn(signature, func, metadata, batched)
    if rule is None:
        # The fit missed its check (oneDNN's convolution backward on [4, 32, 1599]: 1,285,936, 1,388,208 and
        # 1,625,088 bytes of scratch at batches 2, 3 and 4) or the kernel refused a smaller batch: the call itself,
        # where it is small and cheap enough to run.
        if call_flops(func, metadata) > LEARN_FLOPS:
            return None
        return _at_own_size(func, args, kwargs, tensors)
    numel = sum(t.numel() for t, shrinks in zip(tensors, batched, strict=True) if shrinks)
    per_element, constant = rule
    sizes = tuple(None if a is None or b is None else max(0, round(a * numel + b))
                  for a, b in zip(per_element[:-1], constant[:-1], strict=True))
    scratch = max(0, round((per_element[-1] or 0.0) * numel + (constant[-1] or 0.0)))
    return KernelMemory(output_storage_bytes=sizes, scratch_bytes=scratch, output_orders=_ORDERS.get(signature, ()))


def _kernel_setting() -> tuple[bool, int]:
    """What changes a CPU kernel's memory behind the same call: oneDNN on or off, and the intra-op threads. A
    convolution's backward takes scratch per thread (the segment brute force's CNN of 16-channel 3x3 convolutions on
    [8, 3, 32, 32] inputs: 29,952 B more at its peak on 2 threads than on 1). A rule learned on 2 threads and kept
    for a trace after `torch.set_num_threads(1)` put that much on the traced peak of its checkpoint_sequential
    plan over the real step's on 1 thread."""
    import torch

    return bool(torch.backends.mkldnn.enabled), torch.get_num_threads()


_EXACT: dict[Any, KernelMemory | None] = {}
"""What SHAPE_TIED_OPS allocate, by their arguments' full metadata, and other ops at a batch below SIZES."""


def _at_own_size(func: Any, args: Any, kwargs: Any, tensors: list[Any]) -> KernelMemory | None:
    if sum(t.untyped_storage().nbytes() for t in tensors) > EXACT_BYTES:
        return None
    if str(func) == "aten.mkldnn_rnn_layer_backward.default":
        args, kwargs = _with_lstm_workspace(func, args, kwargs)
    if any(t.numel() == 0 for t in strided_tensors((args, kwargs))):
        return None
    signature = (str(func), *_kernel_setting(), *(described(t, False) for t in tensors),
                 tuple(tuple(int(s) for s in t.stride()) for t in tensors), scalars(args, kwargs))
    if signature not in _EXACT:
        try:
            _EXACT[signature] = measure_kernel(func, args, kwargs)
        except Exception:  # the kernel refuses zeros: keep the fake figures
            _EXACT[signature] = None
    return _EXACT[signature]


def _with_lstm_workspace(func: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """The backward's arguments with the workspace its forward kept: a fake forward leaves it empty (kernels.py
    sizes it for the trace), and oneDNN's backward reads it whole (on an empty one it crashes)."""
    import torch

    names = [argument.name for argument in _torch.op_schema(func).arguments]
    values = dict(zip(names, args, strict=False)) | dict(kwargs)
    workspace, source = values.get("workspace"), values["input"]
    if not isinstance(workspace, torch.Tensor) or workspace.numel() or source.dtype != torch.float32:
        return args, kwargs
    nbytes = onednn_lstm_workspace_bytes(int(source.shape[0]), int(source.shape[1]), int(source.shape[-1]),
                                         int(values["hidden_size"]))
    with _torch.disable_dispatch_modes(), _torch.unset_fake_temporarily():
        values["workspace"] = torch.zeros((nbytes,), dtype=workspace.dtype)
    return tuple(values[name] for name in names[:len(args)]), {k: values[k] for k in kwargs}


Rule = tuple[tuple[float | None, ...], tuple[float | None, ...]]
"""Per output position and then scratch: bytes per batched input element, and the constant."""


_RULES: dict[Any, Rule | None] = {}
"""Learned rules by signature: each op's real kernel runs once per process for each kind of call."""

_ORDERS: dict[Any, tuple[tuple[int, ...] | None, ...]] = {}
"""The real outputs' layouts (`dimension_order`) by signature, from the runs that learned its rule: a layout is
assumed not to change with the batch (the runs at each of SIZES agree, or none is kept)."""


def call_flops(func: Any, metadata: Any) -> int:
    """FLOPs of one call, from its arguments' metadata: torch's flop formula for the op; for a composite op, which
    reaches the trace whole only under torch.inference_mode (`aten.conv2d`, `aten.scaled_dot_product_attention`),
    the sum over its parts, as torch's FlopCounterMode counts them on meta tensors. A composite whose parts do not
    run on meta counts as too costly to learn: its cost is unknown, and attention through the math path at a long
    sequence would take seconds and gigabytes."""
    shapes, shape_kwargs = _torch.tree_map(shape_only, metadata)
    flops = forward_flops(func, shapes, shape_kwargs, None)
    if flops or not _torch.is_composite(func):
        return flops
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with _torch.disable_dispatch_modes(), torch.inference_mode(False):
            meta_args, meta_kwargs = _torch.tree_map(meta_like_metadata, metadata)
            with FlopCounterMode(display=False) as counter:
                func(*meta_args, **meta_kwargs)
    except Exception:
        return LEARN_FLOPS + 1
    return int(counter.get_total_flops())


def _measured_at(batch: int, signature: Any, func: Any, metadata: Any,
                 batched: tuple[bool, ...]) -> KernelMemory | None:
    """The real kernel's memory at this (small) batch, measured once per signature; None when it would cost over
    LEARN_FLOPS or the kernel refuses zeros."""
    key = (*signature, "batch", batch)
    if key not in _EXACT:
        memory = None
        try:
            _, call = shrunk(metadata, batched, batch)
            if batch > 0 and call_flops(func, call) <= LEARN_FLOPS:
                memory = measure_kernel(func, *call)
        except Exception:  # the kernel refuses zeros: keep the fake figures
            memory = None
        _EXACT[key] = memory
    return _EXACT[key]


def _learn(signature: Any, func: Any, metadata: Any, batched: tuple[bool, ...]) -> Rule | None:
    """Fit the op's storage and scratch linear in its batched inputs' elements; None when the third size misses
    or the runs would cost over LEARN_FLOPS."""
    if signature in _RULES:
        return _RULES[signature]
    rule: Rule | None = None
    try:
        shrunk_calls = [shrunk(metadata, batched, size) for size in SIZES]
        if call_flops(func, shrunk_calls[-1][1]) <= LEARN_FLOPS:
            points = [(numel, measure_kernel(func, *shrunk)) for numel, shrunk in shrunk_calls]
            rule = _fit(points)
            if rule is not None and len({memory.output_orders for _, memory in points}) == 1:
                _ORDERS[signature] = points[-1][1].output_orders
    except Exception:  # the kernel refuses a smaller batch (an argument tied to it): keep the fake figures
        rule = None
    _RULES[signature] = rule
    return rule


def _fit(points: list[tuple[int, KernelMemory]]) -> Rule | None:
    (n1, m1), (n2, m2), (n3, m3) = points
    if n2 == n1:
        return None
    first = (*m1.output_storage_bytes, m1.scratch_bytes)
    second = (*m2.output_storage_bytes, m2.scratch_bytes)
    third = (*m3.output_storage_bytes, m3.scratch_bytes)
    if not len(first) == len(second) == len(third):
        return None
    slopes: list[float | None] = []
    constants: list[float | None] = []
    for y1, y2, y3 in zip(first, second, third, strict=True):
        if y1 is None or y2 is None or y3 is None:
            slopes.append(None)
            constants.append(None)
            continue
        slope = (y2 - y1) / (n2 - n1)
        constant = y1 - slope * n1
        # The check: the rule must give the third size's bytes, to a cache line.
        if abs(slope * n3 + constant - y3) > 64:
            return None
        slopes.append(slope)
        constants.append(constant)
    return tuple(slopes), tuple(constants)
