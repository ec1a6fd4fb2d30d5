"""Trace one training step: every storage's lifetime, and what each module call does.

The tracer is a TorchDispatchMode, as PyTorch's own MemTracker is: every aten op
that returns a tensor is seen, and each distinct storage is counted once, from
the op that allocated it to the moment its last reference dies (a weakref
callback on the storage). Views and in-place ops return a storage already known,
so they cost nothing; tied weights are one storage. Fake tensors
(FakeTensorMode) and meta tensors have storages of their own, one per
allocation, so the same bookkeeping holds without a byte of real memory.

Around the dispatch mode:
- module forward hooks give the module path of every op in forward;
- a `saved_tensors_hooks` pack hook sees what autograd saves, and where;
- autograd nodes are tagged with the call that created them, so an op run in
  backward is attributed through `torch._C._current_autograd_node()`;
- a checkpointed module reruns its forward during backward: those ops are the
  recompute phase.
"""

# Over 450 lines on purpose: almost all of it is StepTracer, one dispatch mode whose
# hooks (ops, module entry and exit, saved tensors, recomputation) share one set of
# records; the pieces with a job of their own already live in records.py,
# module_state.py, kernels.py, kernel_storage.py and tensor_parallel.py.

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Protocol

import torch
from torch.utils.weak import WeakIdKeyDictionary

from memlayout import _torch
from memlayout.activations.device.roofline import Roofline
from memlayout.activations.facts import (
    GenerationTrace,
    ModuleCall,
    ModuleInfo,
    Phase,
    StorageKind,
    StorageLife,
    Trace,
)
from memlayout.activations.model.parameter_class import attribute_tensors
from memlayout.activations.plans import rerun
from memlayout.activations.step.generate import Generation, cache_of, cache_tensors
from memlayout.activations.step.grad_accumulation import Accumulations
from memlayout.activations.step.optimizer import state_tensors
from memlayout.activations.step.recipe import Recipe
from memlayout.activations.step.run import AfterBackward, Autocast, output_tensors, run_step
from memlayout.activations.trace import tensor_parallel
from memlayout.activations.trace.kernel_storage import learned_kernel_memory
from memlayout.activations.trace.kernels import (
    corrected_output_nbytes,
    draws_random_numbers,
    forward_flops,
    moved_bytes,
    returns_its_input,
    waits_in_place,
)
from memlayout.activations.trace.module_state import (
    module_attributes,
    python_state,
    shown_value,
    state_changes,
)
from memlayout.activations.trace.records import CallRecord, StorageRecord

NODE_KEY = "memlayout.call"
_MOVE_OPS = _torch.device_copy_ops()


class StepTracer(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records storages and module calls while one step runs under it."""

    def __init__(self, model: torch.nn.Module, *, correct_kernels: bool, optimizer: Any = None,
                 roofline: Roofline | None = None, generating: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.model = model
        self.roofline = roofline
        """Prices each forward op's time (FLOPs and bytes moved); None: FLOPs only, no time."""
        self.optimizer = optimizer
        self.correct_kernels = correct_kernels
        self.paths = {id(module): path for path, module in model.named_modules()}
        self.storages: list[StorageRecord] = []
        self.index: Any = WeakIdKeyDictionary()
        self.calls: list[CallRecord] = []
        self.stack: list[CallRecord] = []
        self.pending: list[tuple[Any, int]] = []
        self.saved: set[int] = set()
        self.seq = 0
        self.phase = Phase.SETUP
        self.forward_end = 0
        self.recompute_flops = 0
        self.recompute_seconds = 0.0
        self.backward_call: int | None = None
        self.rerun_depth = 0
        self.parameter_storages: set[int] = set()
        self.state_before: dict[str, dict[str, Any]] = {}
        self.state_changes: dict[str, str] = {}
        self.entry_states: dict[str, list[dict[str, Any]]] = {}
        self.rerun_state_differs: dict[str, str] = {}
        self.accumulations = Accumulations()
        """The engine's gradient sums, summed in place where the user's step would (step/grad_accumulation.py)."""
        self.rng_state_bytes = 0
        """The bytes of one `torch.get_rng_state()` when the step holds them (`recording_rng_states`); else 0."""
        self.tensor_parallel = tensor_parallel.is_sharded(model)
        """The model has tensor-parallel (DTensor) parameters: their ops are traced as the local ops they run."""
        self.propagating = 0
        """Inside DTensor's sharding propagation, which runs each op once more on global shapes (fake ones)."""
        self.generating = generating
        """A generate step: each forward of the model itself and its cache are recorded (`_forward_done`)."""
        self.forwards: list[tuple[int, int]] = []
        self.cache_storages: dict[int, None] = {}
        self.final_cache: tuple[int, ...] = ()

    @contextmanager
    def attached(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, kept: Sequence[Any] = (),
                 host: bool = False) -> Iterator[None]:
        """The tracer on the model while the step runs inside: each module's entry and exit, checkpoint's reruns,
        DTensor's shape propagation, the state before the step (`register_state`), the dispatch mode itself and
        the tensors autograd saves; `host` (a CPU step) also counts the RNG states checkpoint keeps. Every hook
        is removed on the way out, whatever the step raised."""
        with ExitStack() as stack:
            for module in self.model.modules():
                if id(module) in self.paths:
                    stack.enter_context(module.register_forward_pre_hook(self._on_enter, with_kwargs=True))
                    stack.enter_context(module.register_forward_hook(self._on_exit, with_kwargs=True,
                                                                     always_call=True))
            stack.enter_context(rerun.listening(self._rerun))
            if self.tensor_parallel:
                stack.enter_context(_torch.around_dtensor_shape_propagation(tensor_parallel.Propagating(self)))
            self.register_state(args, kwargs, kept)
            if host:
                stack.enter_context(self.recording_rng_states())
            stack.enter_context(self)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor))
            yield

    # storages -------------------------------------------------------------
    def storage_of(self, tensor: torch.Tensor, kind: StorageKind, nbytes: int | None = None) -> int | None:
        """The index of the tensor's storage, recording it as new if it was never seen."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return None
        index: int | None = self.index.get(storage)
        storage_nbytes = storage.nbytes()
        if index is not None:
            record = self.storages[index]
            if record.storage_nbytes == storage_nbytes:
                return index
            # resize_ and set_ change a storage's size: the old allocation ends here.
            self._release(record)
        return self._allocate(storage, storage_nbytes if nbytes is None else nbytes, storage_nbytes, kind)

    def _allocate(self, storage: Any, nbytes: int, storage_nbytes: int, kind: StorageKind) -> int:
        self.seq += 1
        call = self._current_call()
        record = StorageRecord(nbytes, storage_nbytes, kind, self.seq, call, self.phase)
        index = len(self.storages)
        self.storages.append(record)
        record.ref = weakref.ref(storage, functools.partial(self._released, record))
        self.index[storage] = index
        return index

    def _released(self, record: StorageRecord, _ref: Any) -> None:
        self._release(record)

    def _release(self, record: StorageRecord) -> None:
        if record.died is None:
            self.seq += 1
            record.died = self.seq
            self.accumulations.released(record, self.seq)

    @contextmanager
    def recording_rng_states(self) -> Iterator[None]:
        """Count every `torch.get_rng_state()` taken while inside, for as long as the tensor lives.

        `torch.utils.checkpoint` keeps the CPU generator's state (a 5,056-byte tensor on torch 2.13 and 2.14) for
        each checkpointed call from its forward until autograd lets the call's saved tensors go, and its rerun
        forks the generator, taking another. The generator makes that tensor itself, past the dispatcher, so no
        dispatch mode sees it; the CPU allocator does (5 checkpointed calls of a T5 plan: 25,280 bytes over the
        trace). Host memory: a step on the CPU holds it, a step on a GPU does not (trace_step asks only for CPU).
        """
        original = torch.get_rng_state
        self.rng_state_bytes = original().untyped_storage().nbytes()

        def get_rng_state() -> torch.Tensor:
            state = original()
            self.storage_of(state, StorageKind.STEP)
            return state

        torch.get_rng_state = get_rng_state
        try:
            yield
        finally:
            torch.get_rng_state = original

    def _current_call(self) -> int | None:
        if self.stack:
            return self.stack[-1].id
        if self.phase in (Phase.BACKWARD, Phase.RECOMPUTE):
            return self.backward_call
        return None

    # dispatch ---------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.tensor_parallel:
            untraced = tensor_parallel.outside_the_step(func, types, args, kwargs or {}, self.propagating)
            if untraced is not tensor_parallel.TRACE:
                return untraced
        kwargs = kwargs or {}
        phase = self.phase
        summing = False
        if phase is Phase.BACKWARD:
            node: Any = _torch.current_autograd_node()
            self._attribute_backward_op(node)
            summing = not self.stack and self.accumulations.is_sum(func, node, args, kwargs)
        elif phase in (Phase.FORWARD, Phase.LOSS) and self.stack:
            self._check_inputs(func, args, kwargs)
        out = args[0] if returns_its_input(func, args, kwargs) else func(*args, **kwargs)
        if self.correct_kernels and waits_in_place(func):
            out = args[0]
        sizes = corrected_output_nbytes(func, args, kwargs) if self.correct_kernels else None
        # Scratch is invisible to real tensors too (--real): only the output sizes are the fake kernel's to correct.
        learned = learned_kernel_memory(func, args, kwargs, keeps_size=self._is_state)
        if learned is not None and self.correct_kernels:
            out = learned.relaid(out)
            sizes = {**learned.corrected_sizes(out), **(sizes or {})}
        flat = out if isinstance(out, (tuple, list)) else (out,)
        for position, value in enumerate(flat):
            if isinstance(value, torch.Tensor):
                kind = StorageKind.STEP
                index = self.storage_of(value, kind, None if sizes is None else sizes.get(position))
                if phase is Phase.FORWARD and self.stack:
                    self.pending.append((weakref.ref(value), self.stack[-1].id))
                if summing and index is not None:
                    first = self.index.get(args[0].untyped_storage())
                    if first is not None and first != index:
                        self.accumulations.summed(self.storages[first], self.storages[index])
        if learned is not None and learned.scratch_bytes:
            self._scratch(learned.scratch_bytes)
        if phase is Phase.FORWARD or (phase is Phase.LOSS and self.stack) or self._recomputing():
            self._count_cost(func, args, kwargs, out)
        return out

    def _scratch(self, nbytes: int) -> None:
        """A kernel's scratch (kernel_storage.py): allocated after its outputs, freed before the op returns."""
        self.seq += 1
        record = StorageRecord(nbytes, nbytes, StorageKind.STEP, self.seq, self._current_call(), self.phase)
        self.storages.append(record)
        self._release(record)

    def _is_state(self, tensor: torch.Tensor) -> bool:
        """A parameter or buffer: its size does not follow the batch (kernel_storage.py shrinks the rest)."""
        return self.index.get(tensor.untyped_storage()) in self.parameter_storages

    def _recomputing(self) -> bool:
        return self.phase is Phase.RECOMPUTE or (self.phase is Phase.BACKWARD and bool(self.stack))

    def _attribute_backward_op(self, node: Any) -> None:
        if self.stack:  # a checkpointed module's children rerun under their own hooks
            return
        call = node.metadata.get(NODE_KEY) if node is not None else None
        if call is not None:
            self.backward_call = call
            record = self.calls[call]
            if record.backward_start is None:
                record.backward_start = self.seq

    def _check_inputs(self, func: Any, args: Any, kwargs: Any) -> None:
        call = self.stack[-1]
        schema_args = _torch.op_schema(func).arguments
        for position, value in enumerate(args):
            if not isinstance(value, torch.Tensor):
                continue
            known = self._known_or_outside(value)
            if known is None:
                continue
            alias = schema_args[position].alias_info if position < len(schema_args) else None
            if alias is None or not alias.is_write:
                continue
            if self.storages[known].kind is StorageKind.BUFFER:
                call.mutates_buffers = True
            # Writing into an input: checkpoint would rerun from the changed values. Every call on the
            # stack that received this storage changes its input.
            for caller in self.stack:
                if known in caller.inputs and self.storages[known].kind is not StorageKind.PARAMETER:
                    caller.mutates_inputs = True
        if func in _MOVE_OPS:
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            target = args[0].device if func is torch.ops.aten.copy_.default else kwargs.get("device")
            if target is not None and isinstance(source, torch.Tensor) and torch.device(target) != source.device:
                call.moves_device = True
        if torch.Tag.nondeterministic_seeded in func.tags and draws_random_numbers(func, args, kwargs):
            call.uses_randomness = True
        if func is torch.ops.aten.native_batch_norm.default and len(args) > 5 and args[5] and args[3] is not None:
            call.mutates_buffers = True  # its schema does not mark the running statistics it updates

    def _known_or_outside(self, tensor: torch.Tensor) -> int | None:
        """The storage index of a tensor an op reads; a tensor the step neither received nor
        created is state kept outside the module's inputs, parameters and buffers (scalars are
        constants, not state)."""
        if tensor.layout != torch.strided:
            return None
        known: int | None = self.index.get(tensor.untyped_storage())
        if known is None:
            if tensor.numel() > 1 and self.stack and self.phase in (Phase.FORWARD, Phase.LOSS):
                self.stack[-1].reads_outside_state = True
            known = self.storage_of(tensor, StorageKind.OTHER)
        return known

    def _count_cost(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """An op's FLOPs and, with a roofline, its time: to the call it ran in, or to the rerun."""
        flops = forward_flops(func, args, kwargs, out)
        seconds = 0.0
        if self.roofline is not None and not func.is_view:
            moved, dtype = moved_bytes((args, kwargs, out))
            seconds = self.roofline.op_seconds(flops, moved, dtype)
        if not flops and not seconds:
            return
        if self._recomputing():
            self.recompute_flops += flops
            self.recompute_seconds += seconds
        elif self.stack:
            self.stack[-1].flops += flops
            self.stack[-1].seconds += seconds

    # module hooks -----------------------------------------------------------
    def _on_enter(self, module: Any, args: Any, kwargs: Any) -> None:
        path = self.paths.get(id(module))
        if path is not None:
            self._enter(module, path, args, kwargs)

    def _enter(self, module: Any, path: str, args: Any, kwargs: Any) -> None:
        recompute = self.phase in (Phase.BACKWARD, Phase.RECOMPUTE)
        parent = self.stack[-1].id if self.stack else (self.backward_call if recompute else None)
        call = CallRecord(len(self.calls), module, path, parent, recompute, self.seq)
        if not recompute:
            call.inputs = self._storages_of((args, kwargs))
            self.entry_states.setdefault(path, []).append(module_attributes(module, tensors=True))
        elif path not in self.rerun_state_differs:
            self._check_replay(module, path)
        self.calls.append(call)
        self.stack.append(call)

    def _check_replay(self, module: Any, path: str) -> None:
        """A rerun replays its forward only if the module's own attributes are what they were when forward
        called it: RecurrentGemma's RG-LRU reads `self.recurrent_states`, which its forward sets, so its rerun
        starts from the state forward ended with (the loss changed: 4.6104 instead of 4.6110)."""
        now = module_attributes(module, tensors=True)
        seen = self.entry_states.get(path, [])
        if not seen or now in seen:
            return
        before = seen[-1]
        name = next((n for n in sorted(set(now) | set(before)) if now.get(n) != before.get(n)), "?")
        self.rerun_state_differs[path] = (
            f"self.{name} was {shown_value(before.get(name))} when forward called it and {shown_value(now.get(name))} "
            "when backward reran it"
        )

    def _on_exit(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if self.stack and self.stack[-1].module is module:
            self._leave(output)

    def _leave(self, output: Any) -> None:
        call = self.stack.pop()
        call.end = self.seq
        if not call.recompute:
            call.outputs = self._storages_of(output)
            self._tag_pending_nodes()
        if self.generating and call.path == "" and call.parent is None:
            self._forward_done(call, output)

    def _forward_done(self, call: CallRecord, output: Any) -> None:
        """A forward of the model itself ended in a generate step: its span, and the storages its cache holds
        now (an encoder that generate runs on its own is not one: its call's path is not the model's)."""
        self.forwards.append((call.start, call.end))
        cache = cache_of(output)
        held = self._storages_of(list(cache_tensors(cache))) if cache is not None else ()
        self.cache_storages.update(dict.fromkeys(held))
        self.final_cache = held

    def _storages_of(self, values: Any) -> tuple[int, ...]:
        found: dict[int, None] = {}
        for tensor in _tensors(values):
            index = self.storage_of(tensor, StorageKind.OTHER)
            if index is not None:
                found[index] = None
        return tuple(found)

    def _tag_pending_nodes(self) -> None:
        """Tag the autograd nodes of tensors made since the last tag with the call that made them.

        autograd attaches a node to an op's output after the dispatch mode returns it,
        so tagging waits until the module (or the forward) finishes.
        """
        for ref, call in self.pending:
            tensor = ref()
            if tensor is not None and tensor.grad_fn is not None:
                tensor.grad_fn.metadata.setdefault(NODE_KEY, call)
        self.pending.clear()

    def _rerun(self, module: Any, entering: bool) -> None:
        """A checkpointed module's own forward starts or ends (plans/apply.py tells us)."""
        if self.phase not in (Phase.BACKWARD, Phase.RECOMPUTE):
            return
        if entering:
            self._enter(module, self.paths.get(id(module), "?"), (), {})
            self.rerun_depth += 1
            self.set_phase(Phase.RECOMPUTE.value)
            return
        if self.stack and self.stack[-1].module is module:
            self._leave(None)
        self.rerun_depth -= 1
        if self.rerun_depth == 0:
            self.set_phase(Phase.BACKWARD.value)

    # saved tensors ------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.phase in (Phase.FORWARD, Phase.LOSS):
            # autograd saves an op's inputs before the op reaches the dispatch mode
            index = self._known_or_outside(tensor)
            if index is not None and index not in self.parameter_storages:
                self.saved.add(index)
                if self.stack:
                    self.stack[-1].saved.append(index)
        # Detached, as autograd keeps a saved output when no hook is set: the tensor itself would
        # point back, through its grad_fn, at the node that saves it, and a part of the graph that
        # nothing needs any more (a detached result) would then live on (DeepSeek-V4's
        # hyper-connections: 748 KB more than the step without the hook).
        return tensor.detach()

    # the step -----------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        """The step enters a phase (step/run.py says when, and checkpoint's reruns: `_rerun`); the one place the
        phase changes. A forward-only step ends its forward where the step ends (`FORWARD_ONLY_END`)."""
        phase = Phase(name)
        if phase in (Phase.RECOMPUTE, Phase.BACKWARD) and self.phase in (Phase.RECOMPUTE, Phase.BACKWARD):
            self.phase = phase  # into a checkpointed module's rerun, or back out of it
            return
        if phase is Phase.FORWARD:
            self.state_before = python_state(self.model)
        elif self.phase is Phase.FORWARD:
            self.state_changes = state_changes(self.state_before, python_state(self.model))
        if phase is not Phase.FORWARD:
            self._tag_pending_nodes()
        if phase is Phase.BACKWARD:
            self.forward_end = self.seq
        self.phase = phase

    def end_forward_only(self) -> None:
        """A step with no backward (inference, generate): its forward ends where the step does."""
        self.forward_end = self.seq

    def register_state(self, args: Iterable[Any], kwargs: Mapping[str, Any], kept: Iterable[Any] = ()) -> None:
        """Count the model's parameters, buffers, existing gradients, the optimizer's state, the inputs and the
        communication buffers `kept` outside the model (DDP's buckets), before the step."""
        for tensor in kept:
            self.storage_of(tensor, StorageKind.COMMUNICATION)
        for parameter in self.model.parameters():
            # A quantized weight's state (bitsandbytes' absmax and code) is part of the weight, frozen with it.
            for tensor in (tensor_parallel.local(parameter), *attribute_tensors(parameter)):
                index = self.storage_of(tensor, StorageKind.PARAMETER)
                if index is not None:
                    self.parameter_storages.add(index)
            if parameter.grad is not None:
                self.storage_of(parameter.grad, StorageKind.GRADIENT)
        for buffer in self.model.buffers():
            index = self.storage_of(tensor_parallel.local(buffer), StorageKind.BUFFER)
            if index is not None:
                self.parameter_storages.add(index)
        for tensor in state_tensors(self.optimizer):
            self.storage_of(tensor, StorageKind.OPTIMIZER)
        for tensor in _tensors((tuple(args), dict(kwargs))):
            self.storage_of(tensor, StorageKind.INPUT)

    def freeze(self, loss: str, device: str, mode: str, notes: tuple[str, ...]) -> Trace:
        gradients = set()
        for parameter in self.model.parameters():
            if parameter.grad is not None:
                index = self.index.get(parameter.grad.untyped_storage())
                if index is not None:
                    gradients.add(index)
        # State an optimizer makes in its first step is born in the step; it is state all the same.
        optimizer_state = {self.index.get(t.untyped_storage()) for t in state_tensors(self.optimizer)}
        self._propagate_backward_starts()
        storages = tuple(
            StorageLife(
                nbytes=s.nbytes,
                # A gradient that is a view of a communication buffer (DDP's gradient_as_bucket_view) is the buffer.
                kind=StorageKind.GRADIENT if i in gradients and s.kind is not StorageKind.COMMUNICATION
                else StorageKind.OPTIMIZER if i in optimizer_state else s.kind,
                born=s.born,
                died=s.died,
                call=s.call,
                phase=s.phase,
                saved=i in self.saved and (s.died is None or s.died > self.forward_end),
            )
            for i, s in enumerate(self.storages)
        )
        calls = tuple(
            ModuleCall(
                id=c.id, path=c.path, class_name=c.class_name, parent=c.parent, recompute=c.recompute,
                start=c.start, end=c.end, backward_start=c.backward_start, input_storages=c.inputs,
                output_storages=c.outputs, saved_storages=tuple(dict.fromkeys(c.saved)), flops=c.flops,
                seconds=c.seconds,
                uses_randomness=c.uses_randomness,
                moves_device=c.moves_device, reads_outside_state=c.reads_outside_state,
                mutates_buffers=c.mutates_buffers, mutates_inputs=c.mutates_inputs,
            )
            for c in self.calls
        )
        modules = tuple(
            ModuleInfo(
                path=path,
                class_name=type(module).__name__,
                sequential_children=tuple(
                    f"{path}.{name}" if path else name for name, _ in module.named_children()
                ) if isinstance(module, torch.nn.Sequential) else None,
            )
            for path, module in self.model.named_modules()
        )
        return Trace(
            storages=storages, calls=calls, modules=modules, events=self.seq, forward_end=self.forward_end,
            loss=loss, recompute_flops=self.recompute_flops, recompute_seconds=self.recompute_seconds, device=device,
            mode=mode, notes=notes,
            state_changes=tuple(self.state_changes.items()),
            rerun_state_differs=tuple(self.rerun_state_differs.items()), rng_state_bytes=self.rng_state_bytes,
            generation=GenerationTrace(tuple(self.forwards), tuple(self.cache_storages), self.final_cache)
            if self.generating else None,
        )

    def _propagate_backward_starts(self) -> None:
        for call in reversed(self.calls):  # children come after their parents
            if call.parent is None or call.backward_start is None:
                continue
            parent = self.calls[call.parent]
            if parent.backward_start is None or call.backward_start < parent.backward_start:
                parent.backward_start = call.backward_start


def _tensors(values: Any) -> Iterable[torch.Tensor]:
    """The tensors among a module call's inputs or outputs; a tensor-parallel one as its local shard, the memory
    it has on this rank (a DTensor's own storage would be its global shape's)."""
    if isinstance(values, tuple) and len(values) == 2 and isinstance(values[1], Mapping):
        found = [*output_tensors(values[0]), *output_tensors(values[1])]
    else:
        found = list(output_tensors(values))
    for tensor in found:
        yield tensor_parallel.local(tensor)


class StepToTrace(Protocol):
    """What `trace_step` reads of a step (trace/world.py's StepWorld): the model in its world and how it runs."""

    @property
    def model(self) -> Any: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def kwargs(self) -> dict[str, Any]: ...
    @property
    def device(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def optimizer(self) -> Any: ...
    @property
    def autocast(self) -> Autocast | None: ...
    @property
    def inference(self) -> bool: ...
    @property
    def generation(self) -> Generation | None: ...
    @property
    def roofline(self) -> Roofline | None: ...
    @property
    def recipe(self) -> Recipe: ...


def trace_step(step: StepToTrace, notes: tuple[str, ...] = (), kept: Sequence[Any] = ()) -> Trace:
    """Run one step of `step.model` on its inputs under the tracer and return its facts.

    The model is already on fake, meta or real tensors (`step.mode`; kernel corrections apply to fake and meta),
    in train mode. With `step.optimizer`, it steps after backward, its state counted from the start (see
    step/optimizer.py); `step.autocast` is mixed precision around forward and loss; `step.inference` runs forward
    only, under `torch.inference_mode` (see step/run.py), the model's output alive to the end, as the caller's
    would be; `step.generation` runs `model.generate` instead (step/generate.py), each forward and the cache
    recorded; `step.roofline` prices each forward op's time (device/roofline.py). `notes` are carried into the
    trace; `kept` are communication buffers kept outside the model from one step to the next (DDP's gradient
    buckets), counted from the start, as the parameters are.
    """
    model, generation = step.model, step.generation
    tracer = StepTracer(model, correct_kernels=step.mode != "real", optimizer=step.optimizer, roofline=step.roofline,
                        generating=generation is not None)
    with tracer.attached(step.args, step.kwargs, kept=kept, host=step.device == "cpu"):
        loss, how = run_step(model, step.args, step.kwargs, on_phase=tracer.set_phase,
                             after=AfterBackward(step.optimizer, step.recipe.clip), autocast=step.autocast,
                             inference=step.inference, generation=generation)
        if step.inference or generation is not None:
            tracer.end_forward_only()
    del loss
    return tracer.freeze(how, step.device, step.mode, notes)
