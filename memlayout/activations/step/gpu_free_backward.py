"""Backward on fake CUDA tensors where no GPU is present: memlayout's own loop over the autograd graph.

Why torch's engine cannot run it (torch 2.14.1+cu130, no GPU; reproduced with a
3-line step: `w = torch.empty(4, 4, device="cuda", requires_grad=True)` under
FakeTensorMode, then `(w * 2).sum().backward()`):

1. `FakeTensorMode.__enter__` calls `torch._C._ensureCUDADeviceGuardSet()` when torch
   has CUDA but no device (torch/_subclasses/fake_tensor.py, "we patch the cuda device
   guard ... to trace over cuda kernels under FakeTensorMode"). That replaces the CUDA
   device guard with `c10::impl::FakeGuardImpl<CUDA>`
   (c10/core/impl/DeviceGuardImplInterface.cpp, `ensureCUDADeviceGuardSet`), whose
   `deviceCount()` is `kFakeGuardImplMaxDevices`, 8 (c10/core/impl/FakeGuardImpl.h).
   Forward works because of it: every autograd node records its input's stream through
   that guard (`InputMetadata`, torch/csrc/autograd/input_metadata.cpp).
2. `Engine::compute_dependencies` sees a node whose input is on the accelerator and
   calls `GraphTask::stash_current_streams()` (torch/csrc/autograd/engine.cpp). It asks
   the guard how many devices there are (8, the fake guard's answer) and, for each,
   `at::globalContext().getAcceleratorHooksInterface().hasPrimaryContext(idx)`. The
   hooks were never faked: `_hasPrimaryContext` (aten/src/ATen/cuda/detail/CUDAHooks.cpp,
   line 61 in 2.14.1's build) checks `idx < at::cuda::device_count()`, which is 0, and
   raises "hasPrimaryContext expects a valid device index, but got device_index=0".
   (gdb on 2.14.1: `stash_current_streams` calls `FakeGuardImpl<CUDA>::deviceCount()`,
   which returns 8, then `_hasPrimaryContext(0)` throws.)

So the engine fails before it runs a single node, whatever the graph, and
`torch.autograd.set_multithreading_enabled(False)` does not help (the stash is in
`compute_dependencies`, before any thread is chosen). torch's own answer,
`init_gpu_context` in fake_tensor.py, allocates a real CUDA tensor first: it needs a
GPU. make_fx/AOTAutograd joint graphs call the same engine (`torch.autograd.grad`),
and so does compiled autograd (it starts after `compute_dependencies`). No Python
override reaches `CUDAHooks::hasPrimaryContext`.

What runs instead is the engine's loop, in Python, over the same graph, calling each
node as the engine does (`Node.__call__` runs the node's `apply`; a custom Function's
node is `BackwardCFunction.apply`). What it keeps from engine.cpp, because memory
depends on it:
- order: a ready node runs when every node that feeds it has run, the highest
  `sequence_nr` first (forward's last op first; AccumulateGrad first of all);
- gradients for one input are summed as a step with no dispatch mode sums them
  (`InputBuffer::accumulate`): into the first in place when it is dense, not a view, and
  held by its slot alone, else out of place (grad_accumulation.py has why the traced
  step on the CPU needs the same), then checked against the node's
  input metadata: reduced to its shape and cast to its dtype (`validate_outputs`);
- a node's saved tensors are freed once it has run: the loop holds the only
  reference to a node it has taken from the graph (run_step hands over the loss), so
  the node dies, with what it saved, when the loop lets go of it, as
  `release_variables()` frees them in torch's engine;
- AccumulateGrad: the first gradient becomes `.grad` itself when its strides are the
  parameter's (else a copy in the parameter's layout), later ones are added in place;
  tensor hooks on parameters and post-accumulate hooks run;
- a graph task id (`torch._C._current_graph_task_id()`), which non-reentrant
  checkpoint keys its recomputation by: without one it reran a segment once per saved
  tensor (a 2-layer GPT-2's lowest checkpointed peak read 17% high).
- hooks on non-leaf tensors (`register_hook` on an activation, which is how FSDP2 gathers a
  module's parameters again before its backward, `_register_pre_backward_hook`): recorded as
  forward registers them, by the node and input they sit on, and run on the gradient before
  the node runs (the engine's `call_tensor_pre_hooks`);
- `torch._C._will_engine_execute_node`, which `register_multi_grad_hook` asks (torch's
  ModTracker, inside FSDPMemTracker, registers such hooks): whether the node is in the graph.
  Such a hook keeps the nodes it was registered on, and a node kept alive keeps what it
  saved here, where torch's engine would release it (`release_variables()`): forward's
  registrations keep each node by its key instead (`NodeKey`), which is all the question
  needs (measured on FSDP2 ranks: 71 of 121 saved activations stayed alive without it);
- the engine's final callbacks (`Variable._execution_engine.queue_callback`, which FSDP2's root
  queues to finish its reduce-scatters and reshard): run in order once the graph is done.
What it does not: hooks registered on autograd nodes themselves (a module's full backward
hooks) do not run, and a backward inside backward (reentrant checkpoint) calls torch's
engine and fails as above.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from memlayout import _torch
from memlayout.activations.step.autograd_graph import (
    NodeKey,
    dependencies,
    edges,
    is_accumulate_grad,
    node_key,
)
from memlayout.activations.step.grad_accumulation import can_take_the_sum

_TASK_IDS = itertools.count(1 << 40)
"""Graph task ids for `_torch.as_one_graph_task`, clear of the engine's own (a counter from 0)."""

_BACKWARD_IN_PYTHON: ContextVar[bool] = ContextVar("memlayout_backward_in_python", default=False)


_TENSOR_HOOKS: dict[tuple[Any, ...], list[Any]] = {}
"""(node's key, input position) -> the `_backward_hooks` dicts of the non-leaf tensors whose gradient arrives there."""


@contextlib.contextmanager
def backward_in_python() -> Iterator[None]:
    """Within it, `run_step` runs backward with `run_backward` instead of torch's engine, and the hooks forward puts
    on non-leaf tensors are recorded for it."""
    import torch
    import torch.autograd.graph

    token = _BACKWARD_IN_PYTHON.set(True)
    register_hook: Any = torch.Tensor.register_hook  # untyped in some torch releases
    graph: Any = torch.autograd.graph  # its private function's typing differs between torch releases
    grad_fn_of = graph._get_grad_fn_or_grad_acc

    def keyed_for_multi_grad_hooks(tensor: Any) -> Any:
        node = grad_fn_of(tensor)
        caller = sys._getframe(1).f_code.co_name
        return NodeKey(node_key(node)) if caller == "register_multi_grad_hook" else node

    def recorded(tensor: Any, hook: Any) -> Any:
        handle = register_hook(tensor, hook)
        node = tensor.grad_fn
        if node is not None:  # a leaf's hooks run in AccumulateGrad (`_accumulate`)
            hooks = _TENSOR_HOOKS.setdefault((node_key(node), tensor.output_nr), [])
            if not any(held is tensor._backward_hooks for held in hooks):
                hooks.append(tensor._backward_hooks)  # the dict the handle removes from: removal is seen
        return handle

    torch.Tensor.register_hook = recorded  # type: ignore[method-assign]
    graph._get_grad_fn_or_grad_acc = keyed_for_multi_grad_hooks
    try:
        yield
    finally:
        torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]
        graph._get_grad_fn_or_grad_acc = grad_fn_of
        _BACKWARD_IN_PYTHON.reset(token)
        _TENSOR_HOOKS.clear()


def wanted() -> bool:
    """Whether the step's backward is to run here (inside `backward_in_python`)."""
    return _BACKWARD_IN_PYTHON.get()


def cuda_needs_it() -> bool:
    """Whether a fake CUDA step's backward runs here rather than in torch's engine: there is no CUDA device.

    On a CUDA build the engine fails as the module's docstring says. A build without CUDA
    (the Linux CPU wheel), given torch's fake CUDA guard (trace/fake_cuda.py), fails in
    `Engine::execute` too, before the first node: `InputBuffer::add` for the root's
    gradient asks `at::accelerator::getCurrentStream`, which raises "Cannot access
    accelerator device when none is available" (torch 2.13.0+cpu). Where an engine would
    run (macOS, whose accelerator is MPS), the loop here still runs instead, so that every
    build predicts the same step, byte for byte.
    """
    import torch

    return not torch.cuda.is_available()


def run_backward(holder: list[Any]) -> None:
    """`loss.backward()` for the one scalar in `holder`, which this takes out (so the graph can die as it runs).

    Raises:
        RuntimeError: a node's own error, as torch's engine would raise it.
    """
    import torch

    loss = holder.pop()
    root = loss.grad_fn
    if root is None:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    seed = torch.ones_like(loss, memory_format=torch.preserve_format)
    del loss
    waiting = dependencies(root)
    buffers: dict[Any, tuple[Any, list[Any], list[Any]]] = {}
    """node's key -> (the node, the gradients it has received, the nodes kept alive until it runs)."""
    ready: list[tuple[int, int, Any, list[Any], list[Any]]] = [
        (-_torch.autograd_node_sequence_nr(root), 0, root, [seed], [])]
    keep_parents = _custom_nodes_die_with_their_parent()
    # `seed` stays to the end: torch.autograd.backward holds the gradients it starts from until it returns.
    del root
    pushed = 1
    with (torch.no_grad(), _torch.as_one_graph_task(next(_TASK_IDS)), _final_callbacks() as callbacks,
          _torch.engine_executes(set(waiting) | {node_key(ready[0][2])}, node_key)):
        while ready:
            _, _, node, grads, parents = heapq.heappop(ready)
            if not is_accumulate_grad(node):
                _run_tensor_hooks(node, grads)
            with _torch.running_autograd_node(node):
                outputs = _apply(node, grads)
            del grads, parents
            for (child, position), grad in zip(edges(node), outputs, strict=False):
                if child is None:
                    continue
                key = node_key(child)
                if key not in buffers:
                    buffers[key] = (child, [None] * len(_torch.autograd_node_inputs(child)), [])
                if keep_parents and _is_custom_function(child):
                    buffers[key][2].append(node)
                slots = buffers[key][1]
                if grad is not None:
                    _receive(slots, position, _validated(grad, _torch.autograd_node_inputs(child)[position]))
                del grad
                waiting[key] -= 1
                if waiting[key] == 0:
                    del waiting[key]
                    taken, inputs, held = buffers.pop(key)
                    heapq.heappush(ready, (-_torch.autograd_node_sequence_nr(taken), pushed, taken, inputs, held))
                    pushed += 1
                    del taken, inputs, held
                del child, slots
            # The node's last reference: with it go the tensors it saved (torch's release_variables()).
            del node, outputs
        while callbacks:  # in order; a callback may queue more
            callbacks.pop(0)()


def _run_tensor_hooks(node: Any, grads: list[Any]) -> None:
    """The hooks on the tensors whose gradients the node receives, in place on `grads` (a hook may replace one)."""
    key = node_key(node)
    for position, grad in enumerate(grads):
        if grad is None:
            continue
        for hooks in _TENSOR_HOOKS.get((key, position), ()):
            for hook in list(hooks.values()):
                replaced = hook(grad)
                if replaced is not None:
                    grad = replaced
        grads[position] = grad


@contextlib.contextmanager
def _final_callbacks() -> Iterator[list[Any]]:
    """`Variable._execution_engine.queue_callback` as torch's engine takes it during a backward: the callbacks, to
    run once the graph is done (the engine refuses them outside its own backward)."""
    from torch.autograd.variable import Variable

    variable: Any = Variable  # its engine's typing differs between torch releases
    engine = variable._execution_engine
    callbacks: list[Any] = []

    class Engine:
        def queue_callback(self, callback: Any) -> None:
            callbacks.append(callback)

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

    variable._execution_engine = Engine()
    try:
        yield callbacks
    finally:
        variable._execution_engine = engine


def _receive(slots: list[Any], position: int, grad: Any) -> None:
    """A gradient into its input's slot: the first kept, the next summed into it in place where torch's engine sums
    in place (`can_accumulate_inplace`, input_buffer.cpp), else out of place.

    `first` here is referenced as `_held_by_its_slot_alone` measures: by the slot, this local, and
    `_references`'s argument."""
    first = slots[position]
    if first is None:
        slots[position] = grad
    elif _references(first) <= _held_by_its_slot_alone() and can_take_the_sum(first, grad):
        # What grad_accumulation.py asks of the tensors, and held by its slot alone (a node that hands one
        # gradient to two inputs leaves it in two slots, and the sum is then out of place).
        first.add_(grad)
    else:
        slots[position] = first + grad


def _is_custom_function(node: Any) -> bool:
    return hasattr(node, "apply")  # a custom autograd.Function's node (BackwardCFunction)


@functools.cache
def _custom_nodes_die_with_their_parent() -> bool:
    """Whether this torch frees a custom Function's node when the node that points at it dies, though Python
    still holds the node's object.

    torch 2.11 does: the object holds its node weakly, and the GPU machines' 2.11.0+cu130 raised "Attribute
    '_input_metadata' is invalid for this instance of _C._FunctionBase" in this loop, which lets each node die once
    it has run. 2.13 and 2.14 keep the node while its object lives. Where it dies, the loop keeps a custom
    Function's parents until it has run, and with them what they saved: memory read high there, never a failure.
    """
    import torch

    class _Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, tensor: Any) -> Any:
            return tensor.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad

    # Outside the step's modes: a tracer must not count the probe's tensors (it runs once per process).
    with _torch.disable_dispatch_modes(), torch.enable_grad():
        leaf = torch.zeros(1, device="cpu", requires_grad=True)
        output = _Identity.apply(leaf) * 2  # type: ignore[no-untyped-call]
        child = output.grad_fn.next_functions[0][0]
        del output
        try:
            _torch.autograd_node_inputs(child)
        except RuntimeError:
            return True
        return False


def _references(first: Any) -> int:
    import sys

    return sys.getrefcount(first)


@functools.cache
def _held_by_its_slot_alone() -> int:
    """What `_references` reads, called as the loop calls it, of an object that only its slot holds: the slot, the
    caller's `first`, the parameter, and what this Python's `sys.getrefcount` adds for its argument (4 on CPython
    3.11); measured here, as Python versions count such references differently."""
    slots = [object()]
    first = slots[0]
    return _references(first)


def _validated(grad: Any, expected: tuple[tuple[int, ...], Any]) -> Any:
    """The gradient as the receiving node expects it: summed to its input's shape, in its input's dtype."""
    shape, dtype = expected
    if tuple(grad.shape) != shape:
        grad = grad.sum_to_size(shape)
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    return grad


def _apply(node: Any, grads: list[Any]) -> tuple[Any, ...]:
    if is_accumulate_grad(node):
        _accumulate(node.variable, grads[0])
        return ()
    if _is_custom_function(node):
        return _apply_python_function(node, grads)
    outputs = node(*grads)
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _apply_python_function(node: Any, grads: list[Any]) -> tuple[Any, ...]:
    import torch

    if getattr(node, "materialize_grads", True):
        # PyNode::apply gives backward zeros for a gradient nobody sent (ctx.set_materialize_grads).
        grads = [torch.zeros(shape, dtype=dtype) if grad is None else grad
                 for grad, (shape, dtype) in zip(grads, _torch.autograd_node_inputs(node), strict=True)]
    outputs = node.apply(*grads)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    below = edges(node)
    if len(outputs) == len(below):
        return tuple(outputs)
    # backward returns one gradient per forward argument; the node has an edge per tensor argument only.
    wanted_outputs = iter([out for out, needed in zip(outputs, node.needs_input_grad, strict=False) if needed])
    return tuple(None if child is None else next(wanted_outputs, None) for child, _ in below)


def _accumulate(parameter: Any, grad: Any) -> None:
    """What AccumulateGrad does with a leaf's complete gradient (torch/csrc/autograd/functions/accumulate_grad.h)."""
    import torch

    if grad is None:
        return
    for hook in _torch.leaf_gradient_hooks(parameter):
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    if parameter.grad is None:
        if grad.stride() == parameter.stride() or (grad.is_contiguous() and not _dense(parameter)):
            parameter.grad = grad.detach()
        elif _dense(parameter):
            parameter.grad = torch.empty_strided(parameter.shape, parameter.stride(), dtype=grad.dtype).copy_(grad)
        else:
            parameter.grad = grad.clone(memory_format=torch.contiguous_format)
    else:
        parameter.grad += grad
    for post_hook in _torch.post_accumulate_grad_hooks(parameter):
        post_hook(parameter)


def _dense(tensor: Any) -> bool:
    """Non-overlapping and dense: its strides are a permutation of a contiguous tensor's."""
    sizes_strides = sorted((s, n) for n, s in zip(tensor.shape, tensor.stride(), strict=True) if n != 1)
    expected = 1
    for stride, size in sizes_strides:
        if stride != expected:
            return False
        expected *= size
    return True
