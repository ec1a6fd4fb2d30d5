"""Every private torch API memlayout relies on, in one module.

torch promises nothing about a name that starts with an underscore: a release may
rename it, change its signature or drop it. memlayout touches such names only
through the functions below, one per name, each saying what it is relied on for.
`tests/test_private_torch_apis.py` checks every one against the installed torch
(it exists, takes the arguments memlayout passes, behaves as memlayout expects)
and fails with a message naming the API and the torch version; another test
checks that no module outside this one touches a private torch name.

torch is imported inside each function, never here: importing this module loads
nothing, and the commands that read files run without torch installed;
`require` is how a command that runs torch says so, in one line, when it is not.
"""

# Over 450 lines on purpose: every private torch name memlayout touches goes through one small function here,
# so that one module and one test file (tests/test_private_torch_apis.py) hold them all; splitting it would
# bring back the scattered private uses that test forbids outside this file.

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from memlayout.errors import TorchNotInstalledError

T = TypeVar("T")

if TYPE_CHECKING:
    from types import ModuleType

    import torch


def require(purpose: str) -> None:
    """Raise `TorchNotInstalledError` for `purpose` (say, "flatten") when torch is not installed.

    Finds torch without importing it, so it costs nothing where torch is there.
    """
    if importlib.util.find_spec("torch") is None:
        raise TorchNotInstalledError(f"{purpose} needs torch, which is not installed")


# --- storages -----------------------------------------------------------------


def storage_id(storage: Any) -> int:
    """A live storage's identity: the address of torch's C++ storage object (`_cdata`).

    Views of one storage share it; two live storages never do. `data_ptr()` cannot
    serve: every empty, meta and fake storage reports 0.
    """
    identity: int = storage._cdata
    return identity


def has_internal_overlap(tensor: torch.Tensor) -> bool:
    """Whether some elements of `tensor` share memory (an expanded view), by `torch._debug_has_internal_overlap`.

    torch answers 0 (no), 1 (yes) or 2 (too costly to tell); only a sure yes counts.
    """
    import torch

    return bool(torch._debug_has_internal_overlap(tensor) == 1)


# --- RNNs ---------------------------------------------------------------------


def rnn_flat_weight_names(rnn: torch.nn.RNNBase) -> list[str]:
    """The weights' names in the order torch hands them to cuDNN (`RNNBase._flat_weights_names`)."""
    names: list[str] = rnn._flat_weights_names
    return names


def rnn_flat_weights(rnn: torch.nn.RNNBase) -> list[Any]:
    """The weight objects an RNN passes to its kernel, in `_flat_weights_names` order (`_flat_weights`)."""
    weights: list[Any] = rnn._flat_weights
    return weights


def refresh_rnn_flat_weights(rnn: torch.nn.RNNBase) -> None:
    """Rebuild the RNN's list of weight objects from its attributes, without laying them out again.

    This is `RNNBase._init_flat_weights` less its last step: it sets `_flat_weights`
    and `_flat_weight_refs` (the weak references `_weights_have_changed` compares at
    each forward) exactly as that method does, but does not call
    `flatten_parameters()`. On CUDA that call copies every weight into a new cuDNN
    buffer, so the buffer memlayout just filled would be left behind and the
    weights no longer where the plan put them. Laying out for cuDNN is
    `flatten.cudnn_adopt`'s step, after the whole object is re-pointed.
    """
    import weakref

    weights = [getattr(rnn, name) if hasattr(rnn, name) else None for name in rnn._flat_weights_names]
    rnn._flat_weights = weights
    rnn._flat_weight_refs = [weakref.ref(w) if w is not None else None for w in weights]


def rnn_weights_replaced(rnn: torch.nn.RNNBase) -> bool:
    """Whether a weight attribute is no longer the object the RNN last laid out (`RNNBase._weights_have_changed`).

    torch checks this at the start of every forward and, when it is true, runs
    `_init_flat_weights()`, which lays the weights out for cuDNN again: so an RNN
    whose weights were replaced by new Parameters is not copied on every call.
    A weight whose `.data` was swapped keeps its object, and is.
    """
    return bool(rnn._weights_have_changed())  # type: ignore[no-untyped-call]


def cudnn_flattens_rnn_weights() -> bool:
    """Whether this torch lays RNN weights out with cuDNN at all (`torch._use_cudnn_rnn_flatten_weight`; not on
    ROCm)."""
    import torch

    return bool(torch._use_cudnn_rnn_flatten_weight())


def cudnn_rnn_flatten_weight(
    weights: list[torch.Tensor], weight_stride0: int, input_size: int, mode: int, hidden_size: int,
    proj_size: int, num_layers: int, batch_first: bool, bidirectional: bool,
) -> torch.Tensor:
    """`torch._cudnn_rnn_flatten_weight`: what `flatten_parameters()` calls, for weights without a module.

    Allocates cuDNN's weight buffer, copies the weights in and points them at it.
    `mode` is `torch.backends.cudnn.rnn.get_cudnn_mode(name)`.
    """
    import torch

    flat: torch.Tensor = torch._cudnn_rnn_flatten_weight(
        weights, weight_stride0, input_size, mode, hidden_size, proj_size, num_layers, batch_first, bidirectional,
    )
    return flat


# --- torch.save and torch.load's own code, on archives that are ours --------------


def load_pickle_from_records(reader: Any, pickle_module: Any) -> Any:
    """`torch.serialization._load`: what `torch.load` runs once it has opened the zip.

    `reader` answers what torch asks of its zip reader: `has_record(name)`,
    `get_record(name)`, `get_storage_from_record(name, nbytes, storage_type)` and
    `serialization_id()`. Storages map to CPU.
    """
    import torch.serialization

    load: Any = torch.serialization._load
    return load(reader, "cpu", pickle_module, encoding="utf-8")


def save_pickle_to_records(obj: Any, writer: Any, pickle_module: Any) -> None:
    """`torch.serialization._save`: what `torch.save` runs once it has opened the zip.

    `writer` receives what torch gives its zip writer: `write_record(name, data,
    nbytes)` for data.pkl, the bookkeeping records and each storage, and
    `write_record_metadata(name, nbytes)` under `torch.serialization.skip_data`.
    """
    import torch.serialization

    save: Any = torch.serialization._save
    save(obj, writer, pickle_module, torch.serialization.DEFAULT_PROTOCOL, False)


def weights_only_unpickler() -> ModuleType:
    """`torch._weights_only_unpickler`: the pickle module `torch.load(weights_only=True)` uses."""
    import torch._weights_only_unpickler as unpickler

    return unpickler


def weights_only_default_globals() -> frozenset[str] | None:
    """The globals `torch.load(weights_only=True)` accepts by default, as "module.name" paths; None without torch.

    `torch._weights_only_unpickler._get_allowed_globals()`, a dict of path -> object,
    has this name and shape on every torch of the tested range (2.6 to 2.14). It
    leaves out what a user adds with `torch.serialization.add_safe_globals`: that
    list belongs to the process that loads the file, not to the file.
    """
    try:
        return _weights_only_default_globals()
    except ImportError:  # not installed, or hidden (sys.modules["torch"] = None); not cached either way
        return None


@functools.cache
def _weights_only_default_globals() -> frozenset[str]:
    import torch._weights_only_unpickler as unpickler

    return frozenset(unpickler._get_allowed_globals())


# --- fake CUDA on any torch build (activations) ------------------------------------

# c10's DeviceType values (c10/core/DeviceType.h): an index into the guard registry, fixed in torch's ABI.
_CUDA_DEVICE_TYPE = 1
_LAZY_DEVICE_TYPE = 17
_GUARD_REGISTRY = "_ZN3c104impl26device_guard_impl_registryE"
"""`c10::impl::device_guard_impl_registry`, Itanium-mangled (Linux and macOS): one guard per DeviceType."""


class FakeCudaGuardUnavailable(RuntimeError):
    """This torch has no CUDA device guard and memlayout cannot give it torch's fake one (the reason is the text)."""


def fake_cuda_device_guard() -> None:
    """Give a torch built without CUDA the CUDA device guard a CUDA build without a GPU runs fake CUDA tensors with.

    Every C++ path that touches a tensor's device asks its DeviceType's guard
    (`c10::impl::getDeviceGuardImpl`): `.to("cuda")`, `copy_`, `uniform_`, and each
    autograd node, which records its input's stream. On a CUDA build without a GPU,
    `FakeTensorMode.__enter__` calls `torch._C._ensureCUDADeviceGuardSet()`, which puts
    torch's `FakeGuardImpl<CUDA>` (c10/core/impl/FakeGuardImpl.h: 8 devices, no work) in
    the CUDA slot of `c10::impl::device_guard_impl_registry` in place of the real guard,
    whose `deviceCount()` is 0 (c10/core/impl/DeviceGuardImplInterface.cpp). A build
    without CUDA (the Linux CPU wheel, macOS) has no guard in that slot, and the same
    function does nothing: "PyTorch is not linked with support for cuda devices".

    So the slot is lent the guard of another device type whose `deviceCount()` is 0, the
    lazy tensor backend's without a backend registered (torch/csrc/lazy/core/tensor_impl.cpp's
    `LazyGuardImpl`), and torch's own `_ensureCUDADeviceGuardSet()` then puts its
    `FakeGuardImpl<CUDA>` there, as on a CUDA build: the same guard, so the same behaviour.
    The registry is an array of atomic pointers exported by libc10 (read and written with
    ctypes). Idempotent; a process that has a CUDA guard already is left as it is.

    Raises:
        FakeCudaGuardUnavailable: libc10 or its registry cannot be found (Windows' MSVC names), or torch did not
            install its fake guard; the slot is then left empty, as it was.
    """
    import ctypes

    import torch

    if torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        return  # FakeTensorMode installs it itself
    registry = _guard_registry()
    cuda = ctypes.c_void_p.from_address(registry + _CUDA_DEVICE_TYPE * ctypes.sizeof(ctypes.c_void_p))
    if cuda.value:
        return
    lazy = ctypes.c_void_p.from_address(registry + _LAZY_DEVICE_TYPE * ctypes.sizeof(ctypes.c_void_p)).value
    if not lazy:
        raise FakeCudaGuardUnavailable(f"torch {torch.__version__} registers no lazy tensor guard to start from")
    cuda.value = lazy
    torch._C._ensureCUDADeviceGuardSet()
    if cuda.value == lazy:  # torch's function did not replace it: give the slot back empty
        cuda.value = None
        raise FakeCudaGuardUnavailable(f"torch {torch.__version__}'s _ensureCUDADeviceGuardSet installed no guard")


@functools.cache
def _guard_registry() -> int:
    """The address of libc10's `device_guard_impl_registry`."""
    import ctypes
    from pathlib import Path

    import torch

    libraries = sorted(Path(torch.__file__).parent.joinpath("lib").glob("libc10.*"))
    library = next((path for path in libraries if path.suffix in (".so", ".dylib")), None)
    if library is None:
        raise FakeCudaGuardUnavailable(f"torch {torch.__version__} has no libc10.so or libc10.dylib")
    try:
        return ctypes.addressof(ctypes.c_void_p.in_dll(ctypes.CDLL(str(library)), _GUARD_REGISTRY))
    except (OSError, ValueError) as exc:
        raise FakeCudaGuardUnavailable(f"{library.name} exports no device guard registry ({exc})") from None


def has_kernel_for(op_name: str, dispatch_key: str) -> bool:
    """`torch._C._dispatch_has_kernel_for_dispatch_key`: whether the op ("aten::silu_backward") has a kernel of its
    own for the key ("CUDA", "CompositeImplicitAutograd"), as the dispatcher's table holds it."""
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op_name, dispatch_key))


# --- dispatch, autograd and fake tensors (activations) -----------------------------


_PYTHON_ENGINE_NODE: list[Any] = []
"""The node memlayout's own backward (activations/step/gpu_free_backward.py) is running, innermost last."""


def current_autograd_node() -> Any:
    """`torch._C._current_autograd_node()`: the autograd node running now in backward, or None.

    Where memlayout runs backward itself (fake CUDA tensors without a GPU), the node it
    is applying: torch's engine is not running then, and its answer would be None.
    """
    import torch

    if _PYTHON_ENGINE_NODE:
        return _PYTHON_ENGINE_NODE[-1]
    return torch._C._current_autograd_node()


def running_autograd_node(node: Any) -> Any:
    """A context in which `current_autograd_node()` answers `node` (memlayout's backward applies it)."""
    import contextlib

    @contextlib.contextmanager
    def running() -> Any:
        _PYTHON_ENGINE_NODE.append(node)
        try:
            yield
        finally:
            _PYTHON_ENGINE_NODE.pop()

    return running()


def as_one_graph_task(identity: int) -> Any:
    """A context in which `torch._C._current_graph_task_id()` answers `identity` instead of -1.

    Non-reentrant `torch.utils.checkpoint` keys its recomputation by the running graph
    task (torch/utils/checkpoint.py, `unpack_hook`): outside torch's engine the id is -1,
    and it then makes up a new key for every saved tensor it unpacks, so it reruns the
    segment's forward once per saved tensor. memlayout's own backward is one task.
    """
    import torch

    return _set_while_inside(torch._C, "_current_graph_task_id", lambda: identity)

def checkpoint_region(fn: Callable[..., Any], preserve_rng_state: bool, context_fn: Callable[[], Any],
                      *args: Any, **kwargs: Any) -> Iterator[None]:
    """`torch.utils.checkpoint._checkpoint_without_reentrant_generator`: non-reentrant checkpoint of the code run
    between its first `next()` and its second, rerun in backward as `fn(*args, **kwargs)`.

    torch's own composable `checkpoint(module)` (torch/distributed/_composable/checkpoint_activation.py) opens
    it in a module's forward pre-hook and closes it in its forward hook; memlayout opens it at the first child
    of a run of an iterated container and closes it at the last (activations/plans/apply_segments.py). The
    positional arguments after `context_fn` are torch's: determinism_check "default" (the rerun's saved tensors
    are checked against forward's by shape, dtype and device), debug False, early_stop True.
    """
    from torch.utils.checkpoint import _checkpoint_without_reentrant_generator

    generator: Iterator[None] = _checkpoint_without_reentrant_generator(
        fn, preserve_rng_state, context_fn, "default", False, True, *args, **kwargs)
    return generator



def engine_executes(keys: set[Any], key: Callable[[Any], Any]) -> Any:
    """A context in which `torch._C._will_engine_execute_node(node)` answers whether `key(node)` is in `keys` (the
    nodes memlayout's backward will run), instead of raising outside torch's engine
    (`register_multi_grad_hook`'s "all" mode asks it of each tensor's node when the first hook runs)."""
    import torch

    return _set_while_inside(torch._C, "_will_engine_execute_node", lambda node: key(node) in keys)


def autograd_node_sequence_nr(node: Any) -> int:
    """`Node._sequence_nr()`: the order in which forward made the node; torch's engine runs the highest first
    (AccumulateGrad nodes report UINT64_MAX, so a leaf's gradient lands as soon as it is complete)."""
    number: int = node._sequence_nr()
    return number


def autograd_node_inputs(node: Any) -> list[tuple[tuple[int, ...], Any]]:
    """`Node._input_metadata`: the (shape, dtype) of each gradient the node receives, as torch's engine checks
    an incoming gradient against them (`validate_outputs` in torch/csrc/autograd/engine.cpp)."""
    return [(tuple(meta.shape), meta.dtype) for meta in node._input_metadata]


def sdp_priority_order() -> list[int]:
    """`torch._C._get_sdp_priority_order()`: the order SDPA tries its backends in (SDPBackend values), as set by
    `torch.nn.attention.sdpa_kernel(..., set_priority=True)`; torch's default is flash, efficient, math, cuDNN."""
    import torch

    return list(torch._C._get_sdp_priority_order())


def fused_sdp_choice(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
                     enable_gqa: bool) -> int:
    """`torch._fused_sdp_choice`: the SDPBackend value torch's dispatcher picks for this call on this machine's
    GPU (sdp_utils.cpp's `select_sdp_backend`), without running it."""
    import torch

    return int(torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa=enable_gqa))


def leaf_gradient_hooks(tensor: Any) -> list[Any]:
    """`Tensor._backward_hooks`: the hooks `register_hook` put on a leaf, which AccumulateGrad runs on its gradient."""
    return list((tensor._backward_hooks or {}).values())


def post_accumulate_grad_hooks(tensor: Any) -> list[Any]:
    """`Tensor._post_accumulate_grad_hooks`: what `register_post_accumulate_grad_hook` put on a leaf."""
    return list((getattr(tensor, "_post_accumulate_grad_hooks", None) or {}).values())


def cuda_autocast_without_device(dtype: Any) -> Any:
    """`torch.autocast("cuda", dtype)`, enabled although no CUDA device is present.

    `torch.autocast.__init__` turns itself off ("CUDA is not available ... Disabling
    autocast", torch/amp/autocast_mode.py) when `torch.cuda` has no device; its
    `__enter__` only sets the CUDA autocast state from `_enabled`, which needs no device,
    and fake CUDA tensors carry the AutocastCUDA dispatch key, so CUDA's op lists apply.
    """
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        context = torch.autocast("cuda", dtype=dtype)
    context._enabled = True
    return context


CUDA_AUTOCAST_OFF_WARNING = r"CUDA is not available or torch_xla is imported\. Disabling autocast"
"""What `torch.autocast("cuda")` warns when it switches itself off without a device (torch/amp/autocast_mode.py)."""


@contextlib.contextmanager
def cuda_autocast_off_unsaid() -> Iterator[None]:
    """Inside, `torch.autocast("cuda")` switching itself off for want of a device says nothing.

    `torch.utils.checkpoint` reruns a checkpointed call under `torch.autocast(device_type, **forward's
    state)`; on fake CUDA tensors without a device that context switches itself off and warns. A fake
    CUDA step restores forward's autocast inside the rerun itself (plans/apply.py), so the warning's
    claim is no longer true there, and it would only reach a report's stderr.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CUDA_AUTOCAST_OFF_WARNING, category=UserWarning)
        yield


def parameter_of_class(cls: type, data: Any, requires_grad: bool) -> Any:
    """`data` as an instance of the Parameter subclass `cls` sharing its storage (`Tensor._make_subclass`, which
    `nn.Parameter.__new__` calls): a subclass whose `__new__` takes other arguments (bitsandbytes' Params4bit)
    cannot be rebuilt by calling it."""
    import torch

    return torch.Tensor._make_subclass(cls, data, requires_grad)


def op_schema(op: Any) -> Any:
    """An aten op overload's schema (`OpOverload._schema`): its arguments, their names, defaults and aliasing."""
    return op._schema


def is_composite(op: Any) -> bool:
    """Whether an aten op overload is CompositeImplicitAutograd: a function of other ops, which the Autograd keys
    split into its parts before a dispatch mode sees it, except under `torch.inference_mode` (kernel_storage.py)."""
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"))


def device_copy_ops() -> frozenset[Any]:
    """The aten ops that copy a tensor to a device: `aten._to_copy` (`.to()`) and `aten.copy_`."""
    import torch

    return frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default})


def cpu_flash_attention_op() -> Any:
    """`aten._scaled_dot_product_flash_attention_for_cpu`, CPU's fused attention; None where torch has none."""
    import torch

    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def cpu_flash_attention_backward_op() -> Any:
    """`aten._scaled_dot_product_flash_attention_for_cpu_backward`, its backward; None where torch has none."""
    import torch

    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def unset_fake_temporarily() -> Any:
    """`torch._subclasses.fake_tensor.unset_fake_temporarily()`: a context in which the active FakeTensorMode is
    off, so that ops make real tensors (a fake step's small real values and fallback kernels)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily as unset

    return unset()


@contextlib.contextmanager
def around_dtensor_shape_propagation(around: Any) -> Iterator[None]:
    """While inside, DTensor's sharding propagation runs inside `around` (a context manager): the class attribute
    `ShardingPropagator._fake_mode_lock`, which torch enters around the fake op that decides a DTensor op's output
    shape. On a fake step that op runs under the step's own fake mode, and allocates nothing the step does."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    with _set_while_inside(ShardingPropagator, "_fake_mode_lock", around):
        yield


def on_fake_mode_alone(func: Any, args: Any, kwargs: Any) -> Any:
    """`func` under the active FakeTensorMode with every other dispatch mode off (a tracer's, a fake step's): an op
    that only derives shapes (DTensor's sharding propagation), with no value made real and nothing counted."""
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(args)
    with disable_dispatch_modes(), fake_mode if fake_mode is not None else contextlib.nullcontext():
        return func(*args, **kwargs)


def forget_fake_conversions(tensor: Any) -> None:
    """Drop the entries of its fake mode's conversion memo that map a tensor to `tensor` (a FakeTensor).

    `FakeTensorConverter.tensor_memo` (`MetaConverter.tensor_memo`, a WeakValueDictionary) remembers the fake
    tensor each converted tensor became, by a weak reference to it: `nn.Parameter(fake)` leaves one on the
    parameter, and `torch.utils.swap_tensors` refuses a tensor with a weak reference.
    """
    converter = getattr(getattr(tensor, "fake_mode", None), "fake_tensor_converter", None)
    memo = getattr(converter, "tensor_memo", None)
    if memo is None:
        return
    for key in [key for key, value in list(memo.items()) if value is tensor]:
        del memo[key]


def disable_dispatch_modes() -> Any:
    """`torch.utils._python_dispatch._disable_current_modes()`: a context with every dispatch mode off (a tracer's,
    a fake step's, the fake mode's), so that an op runs on the real kernel alone (kernel_storage.py)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def cpu_allocator_events(run: Callable[[], T]) -> tuple[T, list[tuple[int, int]]]:
    """Run `run` once under `torch.profiler.profile(profile_memory=True)` and read `profiler.kineto_results`.

    Returns:
        What `run` returned, and the CPU allocator's events while it ran, in order: (start in ns, bytes),
        positive for an allocation and negative for a free (kernel_storage.py).

    kineto writes lines of its own to the process's standard error, past Python: "USDT: ... profiler_start"
    and "profiler_stop" on every profile (torch 2.13.0+cpu and 2.14.1+cu130 alike), and on the CUDA build with
    no GPU "ERROR: ... gpuGetDeviceCount failed with code 35" once. They are not memlayout's
    to print (a command with nothing to say would say them), so file descriptor 2 points at an unlinked
    temporary file while the profile runs, and whatever else was written there is passed on afterwards.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    with _kineto_lines_kept_off_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
        result = run()
    cpu = torch.profiler.DeviceType.CPU
    events = sorted((e.start_ns(), e.nbytes()) for e in profiled.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == cpu)
    return result, events


# kineto's log lines: a level, a timestamp, process:thread, the source file and line, as libkineto's Logger writes
_KINETO_LINE = re.compile(rb"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.(?:cpp|h):\d+\] ")


@contextlib.contextmanager
def _kineto_lines_kept_off_stderr() -> Iterator[None]:
    """Standard error's file descriptor on an unlinked temporary file; its lines, less kineto's, written back."""
    import tempfile

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no standard error at all: nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(line for line in captured if not _KINETO_LINE.match(line))
            with contextlib.suppress(OSError):  # a closed pipe takes nothing, as it would have taken nothing then
                while kept:
                    kept = kept[os.write(2, kept):]


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """`torch.utils._pytree.tree_flatten`: the leaves of an op's (args, kwargs), and how to rebuild them."""
    from torch.utils._pytree import tree_flatten as flatten

    leaves, spec = flatten(tree)
    return list(leaves), spec


def tree_unflatten(leaves: list[Any], spec: Any) -> Any:
    """`torch.utils._pytree.tree_unflatten`: rebuild what `tree_flatten` took apart, with new leaves."""
    from torch.utils._pytree import tree_unflatten as unflatten

    return unflatten(leaves, spec)


def tree_map(function: Any, tree: Any) -> Any:
    """`torch.utils._pytree.tree_map`: the same nesting of lists, tuples and dicts, each leaf mapped."""
    from torch.utils._pytree import tree_map as mapped

    return mapped(function, tree)


def module_tensor_slots(module: torch.nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
    """A module's own parameter and buffer dicts (`Module._parameters`, `Module._buffers`).

    What `register_parameter` and `register_buffer` fill; setting an entry swaps the tensor a
    module holds (a fake one for a real one) without setattr's checks, ties and order kept.
    """
    return module._parameters, module._buffers


# --- DTensor (sharded live models) -----------------------------------------------------


def dtensor_global_offset(tensor: Any) -> tuple[int, ...]:
    """Where a DTensor's local piece starts in the whole tensor, per dimension
    (`torch.distributed.tensor._utils.compute_local_shape_and_global_offset`, which
    follows every placement, FSDP2's strided shards under tensor parallel included)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(tuple(tensor.shape), tensor.device_mesh,
                                                      tuple(tensor.placements))
    return tuple(int(o) for o in offset)


# --- DistributedDataParallel ------------------------------------------------------------


def ddp_default_bucket_cap_mb() -> int:
    """The bucket size DDP uses when `bucket_cap_mb` is not given, in MiB
    (`torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB`)."""
    from torch.nn.parallel import distributed

    cap: int = distributed._DEFAULT_BUCKET_CAP_MB
    return cap


def ddp_first_bucket_bytes() -> int:
    """The first bucket's cap when `bucket_cap_mb` is not given, in bytes
    (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`)."""
    import torch.distributed as dist

    cap: int = dist._DEFAULT_FIRST_BUCKET_BYTES  # type: ignore[attr-defined]
    return cap


def ddp_rebuild_buckets(module: Any) -> bool:
    """`DistributedDataParallel.reducer._rebuild_buckets()`: free the Reducer's buckets and make them again in the
    order the last backward made the gradients ready, once; what DDP's forward does first from the second step on
    (and its join hook calls directly). True when it rebuilt them; from then on DDP's forward does not."""
    return bool(module.reducer._rebuild_buckets())


@contextlib.contextmanager
def ddp_parameter_check_skipped() -> Iterator[None]:
    """DistributedDataParallel built without its check that every rank's parameters have the same shapes
    (`torch.nn.parallel.distributed._verify_param_shape_across_processes`, on while it is entered).

    The check writes each parameter's shape and strides into a tensor it allreduces; under
    FakeTensorMode that tensor has no data to write (the Reducer's buckets must be built in
    the mode, so DDP is), and under the fake process group there are no other ranks to compare.
    It allocates nothing that outlives DDP's constructor.
    """
    from torch.nn.parallel import distributed

    with _set_while_inside(distributed, "_verify_param_shape_across_processes", lambda *args, **kwargs: None):
        yield


@contextlib.contextmanager
def cuda_lazy_init_skipped() -> Iterator[None]:
    """Within it, `torch.cuda._lazy_init` does nothing: a CUDA factory asks it before it dispatches, and it raises
    where there is no driver (ranks/cuda_devices.py makes such tensors fake meanwhile)."""
    import torch

    with _set_while_inside(torch.cuda, "_lazy_init", lambda: None):
        yield


@contextlib.contextmanager
def _set_while_inside(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` while inside, and what it was before once out (on the way out of an error too)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


# --- classes from torch's private modules ---------------------------------------------
# Attributes of this module, imported on first use (PEP 562): `_torch.FakeTensorMode`.

PRIVATE_CLASSES: dict[str, tuple[str, str]] = {
    # The base of a mode that sees every aten op (activations' tracer).
    "TorchDispatchMode": ("torch.utils._python_dispatch", "TorchDispatchMode"),
    # Tensors with shapes, dtypes and strides but no data, and the class of one.
    "FakeTensorMode": ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    "FakeTensor": ("torch._subclasses.fake_tensor", "FakeTensor"),
    # What FakeTensorMode raises where an op needs a value (`.item()`) or makes a shape from values (`nonzero`).
    "DataDependentOutputException": ("torch._subclasses.fake_tensor", "DataDependentOutputException"),
    "DynamicOutputShapeException": ("torch._subclasses.fake_tensor", "DynamicOutputShapeException"),
    # torch's own memory trackers: live and peak bytes per module and kind, for a
    # process and for one FSDP2 rank.
    "MemTracker": ("torch.distributed._tools.mem_tracker", "MemTracker"),
    "FSDPMemTracker": ("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker"),
    # The kind of change a tracker's `_update_snap` is told of (ADD, DEL, SIZE): rank allocations record them.
    "MemTrackerUpdateType": ("torch.distributed._tools.mem_tracker", "_UpdateType"),
    # The store of the "fake" process group, with which one process plays one rank of many.
    "FakeStore": ("torch.testing._internal.distributed.fake_pg", "FakeStore"),
}
"""Name here -> (torch's module, name there)."""

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException as DataDependentOutputException,
    )
    from torch._subclasses.fake_tensor import (
        DynamicOutputShapeException as DynamicOutputShapeException,
    )
    from torch._subclasses.fake_tensor import FakeTensor as FakeTensor
    from torch._subclasses.fake_tensor import FakeTensorMode as FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker as FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker as MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore as FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode as TorchDispatchMode


def __getattr__(name: str) -> Any:
    if name not in PRIVATE_CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = PRIVATE_CLASSES[name]
    return getattr(importlib.import_module(module), attribute)
