"""Read torch pickles without executing them.

`pickle.Unpickler` runs code only through `find_class` (the callables that REDUCE,
NEWOBJ and BUILD then invoke) and `persistent_load`. This unpickler answers
`find_class` with inert stand-ins: torch's tensor rebuild functions become record
builders, plain containers stay containers, and every other global becomes a
placeholder class that only remembers its name, arguments and state. Nothing from
the file is ever imported or called.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import collections
import io
import pickle
import struct
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from memlayout import _torch
from memlayout.dtypes import DTYPES, STORAGE_CLASS_DTYPES, dtype_info
from memlayout.errors import CorruptCheckpointError
from memlayout.load.pickle_memo import check_stream_memo_indices
from memlayout.load.records import PickleGlobal, section_of

# Globals torch's own weights-only unpickler accepts by default, copied from
# torch 2.14.1's `torch/_weights_only_unpickler.py` (`_get_allowed_globals`) as
# "module.name" paths. Anything else is what `weights_only=False` would import and
# call, which ML601 reports. Notably absent there, so absent here: builtins.dict,
# list, tuple, int, str, slice, frozenset (pickle builds those with opcodes, never
# globals), layouts such as torch.strided (pickled through _get_layout) and memory
# formats. Where torch is installed, its own list decides every global that might
# differ (`weights_only_allows`); the copy alone serves the install without torch.
# tests/load/test_copied_tables.py compares it with every torch of the tested range.
WEIGHTS_ONLY_COPIED_FROM = "2.14.1"
"""The torch release the copied allow-list below comes from: the newest of the tested range."""
_TENSOR_TYPE_NAMES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte")
_STORAGE_TYPE_NAMES = (*_TENSOR_TYPE_NAMES, "Bool", "ComplexDouble", "ComplexFloat")
_DTYPE_NAMES = [
    "bcomplex32", "bfloat16", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool", "complex128",
    "complex32", "complex64", "float16", "float32", "float4_e2m1fn_x2", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "int16", "int32", "int64", "int8", "qint32", "qint8", "quint2x4", "quint4x2", "quint8",
    "uint16", "uint32", "uint64", "uint8"
] + [f"{kind}{bits}" for kind in ("int", "uint") for bits in range(1, 8)]
# The dtypes of the copy that torch 2.13.0, the oldest of the tested range, does not accept. (torch
# 2.6.0 also lacks float4_e2m1fn_x2, float8_e8m0fnu, int1-7 and uint1-7.)
_NEWER_DTYPE_NAMES = ["bcomplex32"]
_REBUILD_FUNCTIONS = [
    "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor",
    "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor"
]
WEIGHTS_ONLY_ALLOWED_PATHS: frozenset[str] = frozenset(
    [
        "collections.OrderedDict",
        "collections.Counter",
        "torch.nn.parameter.Parameter",
        "torch.serialization._get_layout",
        "torch.Size",
        "torch.Tensor",
        "torch.device",
        "_codecs.encode",
        "builtins.bytearray",
        "builtins.set",
        "builtins.complex",
        "torch._tensor._rebuild_from_type_v2",
        "torch.storage.TypedStorage",
        "torch.storage.UntypedStorage",
        "torch.BoolTensor",
        "torch.cuda.BoolTensor",
        "torch.QInt8Storage",
        "torch.QUInt8Storage",
        "torch.QInt32Storage",
        "torch.QUInt4x2Storage",
        "torch.QUInt2x4Storage",
    ]
    + [f"torch.{name}" for name in _DTYPE_NAMES]
    + [f"torch.{q}" for q in ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                              "per_channel_symmetric", "per_channel_affine_float_qparams")]
    + [f"torch._utils.{name}" for name in _REBUILD_FUNCTIONS]
    + [f"{ns}{t}Tensor" for ns in ("torch.", "torch.cuda.", "torch.sparse.", "torch.cuda.sparse.")
       for t in _TENSOR_TYPE_NAMES]
    + [f"{ns}{t}Storage" for ns in ("torch.", "torch.cuda.") for t in _STORAGE_TYPE_NAMES]
)
WEIGHTS_ONLY_NEWER_THAN_OLDEST: frozenset[tuple[str, str]] = frozenset(
    ("torch", name) for name in _NEWER_DTYPE_NAMES
)
"""Globals of the copy that the oldest torch of the tested range (2.13.0) does not accept: for these, as
for every global outside the copy, the installed torch is asked."""
WEIGHTS_ONLY_PROTOCOLS: frozenset[int] = frozenset([2, 3])
"""The pickle protocols torch's weights-only unpickler reads: it refuses protocol 1's
text LONG (the legacy magic number) and protocol 4's FRAME."""
WEIGHTS_ONLY_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    (path.rpartition(".")[0], path.rpartition(".")[2]) for path in WEIGHTS_ONLY_ALLOWED_PATHS
)


def weights_only_allows(module: str, name: str) -> bool:
    """Whether torch's default weights-only loader accepts this global.

    Args:
        module: The module as the pickle spells it (Python 2 names included).
        name: The attribute name.

    Returns:
        True when `torch.load(weights_only=True)` would resolve it: the installed
        torch's own answer where torch is installed, else the copy's. Like torch, it
        first maps Python 2 spellings (`__builtin__.set`) to Python 3 ones. Only
        globals that some torch of the tested range refuses import torch, so a
        plain state dict is read without it.
    """
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    if (module, name) in WEIGHTS_ONLY_ALLOWED and (module, name) not in WEIGHTS_ONLY_NEWER_THAN_OLDEST:
        return True  # every torch of the tested range accepts it: no need to import torch
    torchs = _torch.weights_only_default_globals()
    if torchs is None:  # the install without torch: the copy is all there is
        return (module, name) in WEIGHTS_ONLY_ALLOWED
    return f"{module}.{name}" in torchs


# Slotted and mutable (eq=False: identity mirrors the pickle's memo): one of each is
# built per tensor while unpickling, and slots make that a third cheaper.
@dataclass(eq=False, slots=True)
class PickledStorage:
    """A storage named by a persistent id: the data stays in the file."""

    key: str
    dtype: str
    location: str
    numel: int
    nbytes: int
    """numel x the dtype's itemsize."""


@dataclass(eq=False, slots=True)
class PickledTensor:
    """A tensor rebuilt as metadata only. Identity (`id`) mirrors the pickle's memo."""

    storage: PickledStorage | None
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    is_parameter: bool = False

    def __setstate__(self, state: Any) -> None:
        # BUILD on a tensor comes only from torch < 0.4, which pickled a Parameter
        # (then a Variable) with the state (requires_grad, volatile, hooks), or
        # earlier as (data, grad, hooks, requires_grad, volatile); torch's
        # Tensor.__setstate__ still reads both. Other states are not torch's: ignored.
        if not isinstance(state, tuple):
            return
        if len(state) == 5:
            data = state[0]
            if type(data) is PickledTensor:
                self.storage, self.offset, self.shape = data.storage, data.offset, data.shape
                self.stride, self.dtype = data.stride, data.dtype
            state = (state[3], state[4], state[2])
        if len(state) == 3:
            self.requires_grad = state[0] is True


class LegacyParameter:
    """What `torch.nn.parameter.Parameter` unpickles to.

    Since torch 0.4 the class only names the type `_rebuild_from_type_v2` gives a
    rebuilt tensor, which marks it a parameter. torch < 0.4's files pickled a
    Parameter as REDUCE `Parameter(data)` and BUILD with its state, or as NEWOBJ
    `Parameter()` and BUILD with a state holding the data. Both make a fresh
    parameter record here (a class, because NEWOBJ accepts only classes);
    `PickledTensor.__setstate__` then reads the state.
    """

    def __new__(cls, data: Any = None, requires_grad: Any = True) -> Any:
        if type(data) is PickledTensor:
            return PickledTensor(
                data.storage, data.offset, data.shape, data.stride, data.dtype, requires_grad is True, True
            )
        return PickledTensor(None, 0, (0,), (1,), "float32", requires_grad is True, True)


@dataclass(frozen=True)
class StorageDtype:
    """What `torch FloatStorage` and friends unpickle to: just the element dtype."""

    # A value of the unpickled tree, not a record: the tree's walkers descend into
    # every tuple, so this stays a dataclass, opaque to them as the class it stands for.
    dtype: str


_NO_ITEMS: tuple[Any, ...] = ()
_NO_KWARGS: dict[str, Any] = {}
"""Shared by every placeholder called without keywords (never mutated): `**kwargs` is a new dict per call."""


class InertObject:
    """Base of placeholders for classes memlayout refuses to import.

    NEWOBJ, REDUCE and BUILD on a placeholder only store their inputs, so a pickled
    `nn.Module` yields a tree of these whose `state` holds `_parameters`,
    `_buffers` and `_modules` as plain dicts.

    Slotted, and placeholder classes are too: a DCP `.metadata` of 100,000 tensors
    unpickles to half a million of these, and an instance dict each tripled the
    tree's memory.
    """

    __slots__ = ("args", "items", "kwargs", "state")

    class_module: str = ""
    class_name: str = ""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any
    items: list[Any] | tuple[Any, ...]
    """What APPENDS and SETITEMS added; an empty tuple until the first."""

    def __new__(cls, *args: Any, **kwargs: Any) -> InertObject:
        # NEWOBJ calls only cls.__new__ (never __init__), so the fields are set here.
        instance = super().__new__(cls)
        instance.args = args
        instance.kwargs = kwargs if kwargs else _NO_KWARGS
        instance.state = None
        instance.items = _NO_ITEMS
        return instance

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __call__(self, *args: Any, **kwargs: Any) -> InertObject:
        # REDUCE on a placeholder's result, as in getattr(__import__("os"), "system")(cmd),
        # yields one more inert record, so the pickle still reads and ML601 can name it.
        return InertObject(*args, **kwargs)

    # Containers pickled with APPENDS / SETITEMS call these on the object.
    def append(self, item: Any) -> None:
        self._item_list().append(item)

    def extend(self, items: Any) -> None:
        self._item_list().extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._item_list().append((key, value))

    def _item_list(self) -> list[Any]:
        if type(self.items) is not list:
            self.items = []
        return self.items

    @classmethod
    def qualified_name(cls) -> str:
        return f"{cls.class_module}.{cls.class_name}"

    @property
    def state_dict(self) -> dict[str, Any]:
        """The instance dict as pickled, whichever way BUILD delivered it."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            # (dict_state, slot_state), as pickle's default __reduce_ex__ sends it.
            merged: dict[str, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        return state if isinstance(state, dict) else {}


def _dtype_name(value: Any) -> str:
    if isinstance(value, StorageDtype):
        return value.dtype
    if isinstance(value, str):
        return value
    if isinstance(value, type) and issubclass(value, InertObject):
        return value.class_name
    return "uint8"


def _rebuild_tensor(
    storage: Any, offset: int, size: Any, stride: Any, *rest: Any
) -> PickledTensor:
    # Called once per tensor of the pickle: the common case (a storage from
    # persistent_load, tuples for size and stride) takes no conversion.
    requires_grad = bool(rest[0]) if rest else False
    if type(storage) is PickledStorage:
        return PickledTensor(storage, int(offset), tuple(size), tuple(stride), storage.dtype, requires_grad)
    return PickledTensor(None, int(offset), tuple(size), tuple(stride), "uint8", requires_grad)


def _rebuild_tensor_v3(
    storage: Any, offset: int, size: Any, stride: Any, requires_grad: Any, hooks: Any, dtype: Any, *rest: Any
) -> PickledTensor:
    tensor = _rebuild_tensor(storage, offset, size, stride, requires_grad)
    tensor.dtype = _dtype_name(dtype)
    return tensor


def _rebuild_parameter(data: Any, requires_grad: Any = True, *rest: Any) -> Any:
    if isinstance(data, PickledTensor):
        # A new object: each Parameter in the pickle is its own identity.
        return PickledTensor(
            data.storage, data.offset, data.shape, data.stride, data.dtype, bool(requires_grad), True
        )
    return data


def _rebuild_meta(dtype: Any, size: Any, stride: Any, requires_grad: Any = False, *rest: Any) -> PickledTensor:
    return PickledTensor(None, 0, tuple(size), tuple(stride), _dtype_name(dtype), bool(requires_grad))


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    # Tensor subclasses pickle as (rebuild function, subclass, args, state). The
    # function is itself resolved through find_class, so calling it is safe.
    result = func(*args) if callable(func) else None
    if isinstance(result, PickledTensor) and new_type is LegacyParameter:
        result.is_parameter = True
    return result


def _safe_codecs_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Protocol-2 pickles spell bytes as _codecs.encode(str, "latin1"). Any other
    # codec name would make codecs import a module from the encodings package.
    if str(encoding).lower().replace("_", "-") not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise pickle.UnpicklingError(f"_codecs.encode with codec {encoding!r} is not something torch writes")
    return codecs.encode(text, encoding, errors)


def _torch_device(*args: Any) -> str:
    return ":".join(str(a) for a in args if a is not None)


_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "Counter"): collections.Counter,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("__builtin__", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("_codecs", "encode"): _safe_codecs_encode,
    # Built-in callables where one does the job: REDUCE then calls compiled code, and
    # a DCP .metadata of 100,000 tensors makes three torch.Size per tensor. tuple()
    # of a tuple is that tuple; str() of a layout name is that name.
    ("torch", "Size"): tuple,
    ("torch.serialization", "_get_layout"): str,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): int,
    ("torch", "device"): _torch_device,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _rebuild_meta,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
}


class TextPersistentIdError(pickle.UnpicklingError):
    """A persistent id that protocol 0 wrote as text, where torch's are tuples."""


@dataclass
class UnpickleResult:
    """The inert object tree plus what the pickle referenced."""

    root: Any
    globals: list[PickleGlobal] = field(default_factory=list)
    made_placeholders: bool = True
    """Whether any global became a placeholder; without one the tree holds no module."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds records and placeholders instead of running code."""

    def __init__(
        self, stream: io.BufferedIOBase | io.BytesIO, storage_records: bool = True, encoding: str = "ASCII"
    ) -> None:
        # `encoding` decodes Python 2 `str` objects, as in pickle.Unpickler; torch.load
        # passes "utf-8", which a Python 2 file's class sources can need.
        # CPython's C unpickler asks a stream without `peek` for each opcode's bytes
        # with a call to its `read`: 1.3 million calls for the pickle of a 40,000-tensor
        # state dict, 40% of unpickling it. A BufferedReader over an in-memory pickle
        # has `peek`, so the unpickler takes the bytes a buffer at a time. (It reads
        # the BytesIO ahead of the pickle's end; no caller reads the BytesIO after.)
        super().__init__(io.BufferedReader(stream) if type(stream) is io.BytesIO else stream, encoding=encoding)
        self.stream = stream
        """What `run_unpickler` checks before loading (see `memlayout.load.pickle_memo`)."""
        self._placeholders: dict[tuple[str, str], type[InertObject]] = {}
        self._storages: dict[str, PickledStorage] = {}
        self._itemsizes: dict[str, int] = {}
        self.referenced: dict[tuple[str, str], PickleGlobal] = {}
        self._storage_records = storage_records

    @property
    def made_placeholders(self) -> bool:
        """Whether any global became a placeholder (every pickled nn.Module does)."""
        return bool(self._placeholders)

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        if key not in self.referenced:
            self.referenced[key] = PickleGlobal(module, name, weights_only_allows(module, name))
        if key in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[key]
        if key == ("torch.nn.parameter", "Parameter"):
            # Since torch 0.4 a Parameter pickles through _rebuild_parameter and the
            # class appears only as _rebuild_from_type_v2's type; before, it was
            # REDUCE Parameter(data) plus a Variable state, in tar and non-zip files alike.
            return LegacyParameter
        if module in ("torch", "torch.storage") and name in STORAGE_CLASS_DTYPES:
            return StorageDtype(STORAGE_CLASS_DTYPES[name])
        if module == "torch" and name in DTYPES:
            return name
        return self._placeholder(module, name)

    def _placeholder(self, module: str, name: str) -> type[InertObject]:
        key = (module, name)
        if key not in self._placeholders:
            self._placeholders[key] = type(
                name,
                (InertObject,),
                {"class_module": module, "class_name": name, "__module__": __name__, "__slots__": ()},
            )
        return self._placeholders[key]

    @property
    def storages(self) -> dict[str, PickledStorage]:
        """Every storage the pickle's persistent ids named, by key."""
        return self._storages

    def persistent_load(self, pid: Any) -> Any:
        # Called once per tensor of the file; torch's own id is ("storage", storage
        # type, key, location, numel), and a storage seen before is one dict lookup.
        if not self._storage_records:
            raise pickle.UnpicklingError("unexpected persistent id in a plain pickle")
        if type(pid) is tuple and len(pid) >= 5 and pid[0] == "storage":
            key = pid[2]
            if type(key) is not str:
                key = str(key)
            storage = self._storages.get(key)
            if storage is None:
                storage = self._new_storage(pid[1], key, pid[3], pid[4])
            return storage
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "module":
            # Legacy torch.save files name each nn.Module class once as
            # ("module", class, source file, source); the class is already a placeholder.
            return pid[1]
        if isinstance(pid, str):
            raise TextPersistentIdError(
                f"persistent id {pid!r:.80} is text, not a tuple: pickle protocol 0 writes every persistent id "
                "as a line of text, and torch.load refuses it too (saved_id must be a tuple)"
            )
        raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")

    def _new_storage(self, storage_type: Any, key: str, location: Any, count: Any) -> PickledStorage:
        dtype = storage_type.dtype if type(storage_type) is StorageDtype else _dtype_name(storage_type)
        count = int(count)
        itemsize = self._itemsizes.get(dtype)
        if itemsize is None:
            itemsize = self._itemsizes[dtype] = dtype_info(dtype).itemsize
        storage = PickledStorage(key, dtype, location if type(location) is str else str(location), count,
                                 count * itemsize)
        self._storages[key] = storage
        return storage


# What a damaged stream raises from inside the unpickler. MemoryError comes from a
# length field far beyond the data: the unpickler allocates before it reads.
_UNPICKLE_ERRORS = (
    pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
    AttributeError, UnicodeDecodeError, OverflowError, MemoryError, struct.error,
)


_BYTEARRAY_DEALLOC_REPORT = "deallocated bytearray object has exported buffers"


class _BytearrayReportFilter:
    """One process-wide `sys.excepthook` that drops that report from unpickling threads only.

    Swapping `sys.excepthook` per call is not thread-safe: two overlapping calls
    restore each other's hooks, and one can leave its filter installed for good.
    Here the filter is installed when the first load starts and removed when the
    last one ends (unless someone installed another hook meanwhile), and it drops
    the report only when it comes from a thread that is unpickling right now: a
    report from any other thread, and every other error, reaches the previous hook.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._previous: Any = None
        self._local = threading.local()

    def __call__(self, kind: type[BaseException], value: BaseException, trace: Any) -> None:
        if getattr(self._local, "depth", 0) and kind is SystemError and str(value) == _BYTEARRAY_DEALLOC_REPORT:
            return
        (self._previous or sys.__excepthook__)(kind, value, trace)

    def __enter__(self) -> None:
        with self._lock:
            if self._active == 0:
                self._previous = sys.excepthook
                sys.excepthook = self
            self._active += 1
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def __exit__(self, *exc_info: object) -> None:
        self._local.depth -= 1
        with self._lock:
            self._active -= 1
            if self._active == 0 and sys.excepthook is self:
                sys.excepthook = self._previous


_DROP_BYTEARRAY_REPORT = _BytearrayReportFilter()


def run_unpickler(unpickler: pickle.Unpickler, what: str) -> Any:
    """`unpickler.load()`, with a damaged stream raised as one `CorruptCheckpointError`.

    CPython 3.11's unpickler, given a BYTEARRAY8 whose length cannot be allocated,
    frees a half-built bytearray whose export count was never set; the bytearray's
    destructor then reports a SystemError through `sys.excepthook`, which prints a
    second line beside the one error the CLI promises. While loading, that one
    report from this thread is dropped; safe to call from several threads at once.

    A `RestrictedUnpickler`'s stream is first checked for memo indices that would
    make the C unpickler allocate without bound (`memlayout.load.pickle_memo`).
    """
    stream = getattr(unpickler, "stream", None)
    if stream is not None:
        check_stream_memo_indices(stream, what)
    with _DROP_BYTEARRAY_REPORT:
        try:
            return unpickler.load()
        except _UNPICKLE_ERRORS as exc:
            # A MemoryError has no message; the line must still say what went wrong.
            raise CorruptCheckpointError(f"{what} could not be read: {str(exc) or type(exc).__name__}") from exc


def unpickle(data: bytes | memoryview, storage_records: bool = True, what: str = "the pickle") -> UnpickleResult:
    """Unpickle `data` into inert records, executing nothing from it.

    Args:
        data: The pickle bytes (e.g. a torch zip's `data.pkl`).
        storage_records: Accept torch's `('storage', ...)` persistent ids.
        what: The pickle as error messages name it, e.g. "model.pt: data.pkl".

    Returns:
        The object tree, with tensors as `PickledTensor`, storages as `PickledStorage`
        and foreign classes as `InertObject` placeholders, and every global referenced.

    Raises:
        CorruptCheckpointError: the pickle stream is malformed or truncated.
    """
    unpickler = RestrictedUnpickler(io.BytesIO(data), storage_records)
    root = run_unpickler(unpickler, what)
    return UnpickleResult(root, list(unpickler.referenced.values()), unpickler.made_placeholders)


WalkedTensor = tuple[str, PickledTensor, bool, bool, str]
"""A tensor found in the object tree: (dotted name, tensor, is_buffer, in_optimizer, section).

A plain tuple, not a record class: the walk yields one per tensor of the file."""


def is_module_state(state: dict[str, Any]) -> bool:
    """An nn.Module's pickled instance dict has these keys."""
    return "_parameters" in state and "_modules" in state


def walk_tensors(obj: Any, prefix: str = "") -> list[WalkedTensor]:
    """Every tensor in an unpickled tree with its dotted name, in pickle order.

    Dicts contribute their keys, lists and tuples their indices, pickled modules
    their parameters, buffers and children. A dict with `state` and
    `param_groups` is an optimizer's state dict.
    """
    found: list[WalkedTensor] = []
    if type(obj) is PickledTensor:
        found.append((prefix, obj, False, False, ""))
    else:
        _walk(obj, prefix, False, set(), "", found)
    return found


def walk_modules(obj: Any, prefix: str = "") -> Iterator[tuple[str, InertObject]]:
    """Yield (dotted path, placeholder) for every pickled nn.Module in a tree."""
    yield from _walk_modules(obj, prefix, set())


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _children(obj: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(obj, dict):
        yield from obj.items()
    elif isinstance(obj, (list, tuple)):
        yield from enumerate(obj)
    elif isinstance(obj, InertObject):
        yield from obj.state_dict.items()
        yield from enumerate(obj.items)


def _walk(
    obj: Any, prefix: str, in_optimizer: bool, seen: set[int], section: str, found: list[WalkedTensor]
) -> None:
    # Appends to one list rather than yielding through every level: a state dict's
    # tensors are each one step below the root, and a generator per step cost more
    # than the rest of the walk.
    if id(obj) in seen or not isinstance(obj, (dict, list, tuple, InertObject)):
        return
    seen.add(id(obj))
    if isinstance(obj, InertObject) and is_module_state(obj.state_dict):
        state = obj.state_dict
        # Parameters, then buffers, then children: the order named_parameters walks.
        for holder, is_buffer in (("_parameters", False), ("_buffers", True)):
            for key, value in (state.get(holder) or {}).items():
                if type(value) is PickledTensor:
                    found.append((_join(prefix, key), value, is_buffer, in_optimizer, section))
        for key, value in (state.get("_modules") or {}).items():
            _walk(value, _join(prefix, key), in_optimizer, seen, section, found)
        return
    if isinstance(obj, dict) and {"state", "param_groups"} <= obj.keys():
        in_optimizer = True
    dotted = f"{prefix}." if prefix else ""
    for key, value in obj.items() if type(obj) is dict or type(obj) is collections.OrderedDict else _children(obj):
        if type(value) is PickledTensor:
            # A tensor keeps its parent's section (section_of with value_is_tensor).
            # A top-level name is the key itself: a state dict's 100,000 names are
            # not copied.
            name = key if not dotted and type(key) is str else f"{dotted}{key}"
            found.append((name, value, False, in_optimizer, section))
        else:
            _walk(value, f"{dotted}{key}", in_optimizer, seen, section_of(prefix, key, False, section), found)


def _walk_modules(obj: Any, prefix: str, seen: set[int]) -> Iterator[tuple[str, InertObject]]:
    if id(obj) in seen or not isinstance(obj, (dict, list, tuple, InertObject)):
        return
    seen.add(id(obj))
    if isinstance(obj, InertObject) and is_module_state(obj.state_dict):
        yield prefix, obj
        for key, value in (obj.state_dict.get("_modules") or {}).items():
            yield from _walk_modules(value, _join(prefix, key), seen)
        return
    for key, value in _children(obj):
        yield from _walk_modules(value, _join(prefix, key), seen)
