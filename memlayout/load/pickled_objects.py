"""What the restricted unpickler builds instead of torch's objects: inert records and placeholders.

`memlayout.load.restricted_pickle` makes them; the loaders and the tree walkers
(`memlayout.load.pickle_walk`) read them. None of them runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


def _record_nothing(state: Any) -> None:
    return None


class _PlaceholderClass(type):
    """The type of every placeholder class.

    A pickle can BUILD the class object itself, not an instance of it: picklescan's
    sys_module_override_sploit.pkl names `torch._utils` as a global and sets its
    state, to replace what `torch._utils` holds. `getattr(cls, "__setstate__")`
    would then be the plain function, called without an instance; this data
    descriptor on the metaclass, which wins over the class's own attribute for the
    class and never for an instance, makes it record nothing instead.
    """

    @property
    def __setstate__(cls) -> Any:
        return _record_nothing


class InertObject(metaclass=_PlaceholderClass):
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
