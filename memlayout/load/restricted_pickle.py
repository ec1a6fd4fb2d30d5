"""Read torch pickles without executing them.

`pickle.Unpickler` runs code only through `find_class` (the callables that REDUCE,
NEWOBJ and BUILD then invoke) and `persistent_load`. This unpickler answers
`find_class` with inert stand-ins: torch's tensor rebuild functions become record
builders, plain containers stay containers, and every other global becomes a
placeholder class that only remembers its name, arguments and state. Nothing from
the file is ever imported or called.
"""

from __future__ import annotations

import codecs
import collections
import io
import pickle
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from memlayout.dtypes import DTYPES, STORAGE_CLASS_DTYPES, dtype_info
from memlayout.errors import CorruptCheckpointError
from memlayout.load.array_pickles import (
    JOBLIB_ARRAY_WRAPPER,
    ExactReads,
    SequentialReads,
    WrappedArray,
    joblib_wrapper_class,
)
from memlayout.load.pickle_memo import check_stream_memo_indices
from memlayout.load.pickled_objects import (
    InertObject,
    LegacyParameter,
    PickledStorage,
    PickledTensor,
    StorageDtype,
)
from memlayout.load.records import PickleGlobal
from memlayout.load.weights_only_allowlist import weights_only_allows


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


class InertGlobals:
    """What both unpicklers answer `find_class` and `persistent_load` with: records and placeholders."""

    checks_memo = True
    """Whether `run_unpickler` must check the memo indices first: CPython's C unpickler grows its memo
    as a dense array (`memlayout.load.pickle_memo`); the pure-Python one keeps a dict."""

    def _begin(self, stream: Any, storage_records: bool) -> None:
        self.stream = stream
        """What `run_unpickler` checks before loading (see `memlayout.load.pickle_memo`)."""
        self.start = stream.tell() if isinstance(stream, ExactReads) else 0
        """Where the pickle starts in an `ExactReads` stream: memo indices are counted from there."""
        self.arrays: list[WrappedArray] = []
        """The arrays joblib wrote between the opcodes, skipped (read from a stream read exactly only)."""
        self._placeholders: dict[tuple[str, str], type[InertObject]] = {}
        self._storages: dict[str, PickledStorage] = {}
        self._itemsizes: dict[str, int] = {}
        self.referenced: dict[tuple[str, str], PickleGlobal] = {}
        self._storage_records = storage_records

    def read_nested_pickle(self, what: str) -> None:
        """Read one more pickle from this unpickler's stream, its globals joining this one's (a joblib array of
        objects)."""
        nested = type(self)(self.stream, storage_records=False)  # type: ignore[call-arg]
        nested.referenced = self.referenced
        run_unpickler(nested, what)  # type: ignore[arg-type]  # a concrete unpickler: this is a mixin

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
        if key == JOBLIB_ARRAY_WRAPPER and isinstance(self.stream, (ExactReads, SequentialReads)):
            # Only a stream read exactly is joblib's: any other reader (torch.load's
            # unpickler among them) sees the wrapper as a class, and no raw bytes.
            if key not in self._placeholders:
                self._placeholders[key] = joblib_wrapper_class(self)
            return self._placeholders[key]
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


class RestrictedUnpickler(InertGlobals, pickle.Unpickler):
    """An unpickler that builds records and placeholders instead of running code."""

    def __init__(
        self, stream: io.BufferedIOBase | io.BytesIO | ExactReads, storage_records: bool = True, encoding: str = "ASCII"
    ) -> None:
        # `encoding` decodes Python 2 `str` objects, as in pickle.Unpickler; torch.load
        # passes "utf-8", which a Python 2 file's class sources can need.
        # CPython's C unpickler asks a stream without `peek` for each opcode's bytes
        # with a call to its `read`: 1.3 million calls for the pickle of a 40,000-tensor
        # state dict, 40% of unpickling it. A BufferedReader over an in-memory pickle
        # has `peek`, so the unpickler takes the bytes a buffer at a time. (It reads
        # the BytesIO ahead of the pickle's end; no caller reads the BytesIO after.)
        super().__init__(io.BufferedReader(stream) if type(stream) is io.BytesIO else stream, encoding=encoding)
        self._begin(stream, storage_records)


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


def run_unpickler(unpickler: pickle.Unpickler | pickle._Unpickler, what: str) -> Any:
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
    if stream is not None and getattr(unpickler, "checks_memo", True):
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


class FirstPickle(NamedTuple):
    """What the restricted unpickler made of the pickle that opens a file."""

    complete: bool
    """It read one whole pickle, up to its STOP."""
    referenced: list[PickleGlobal]
    """The globals it resolved, up to where it stopped."""


def read_first_pickle(path: str) -> FirstPickle:
    """Read the file from byte 0 as `pickle.load` does, executing nothing.

    `torch.load(weights_only=False)` hands a file that is neither a zip nor a tar
    archive to `pickle.load` before it checks the magic number, and `pickle.load`
    takes the first byte as an opcode, whatever it is: a protocol 0 or 1 pickle
    opens with `(`, `c`, `]`, `}` or any other opcode, not PROTO. Every global it
    resolves along the way is imported, and called by REDUCE, there and then.

    Args:
        path: The file.

    Returns:
        Whether a whole pickle was read, and the globals resolved on the way.
    """
    with open(path, "rb") as handle:
        unpickler = RestrictedUnpickler(handle, False)
        try:
            run_unpickler(unpickler, path)
        except CorruptCheckpointError:
            return FirstPickle(False, list(unpickler.referenced.values()))
    return FirstPickle(True, list(unpickler.referenced.values()))
