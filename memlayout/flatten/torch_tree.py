"""A torch.save file's object tree, rebuilt by torch's own unpickler, and pickled back as torch.save does.

Flatten needs IN's real objects (a state dict's OrderedDict and its `_metadata`,
Parameters, a trusted module pickle's modules) so that OUT's `data.pkl` is exactly
what torch.save writes for the flat tree. It never needs IN's old bytes: those go
straight from file to file. So both directions run torch's own serialization code
on a zip reader that is ours:

- `rebuild_tree` runs `torch.serialization._load` (what `torch.load` runs once it
  has opened the file) with data.pkl and the small records read through
  `memlayout.io.zip_archive`, and gives every storage persistent id a stand-in: an
  untouched allocation of the record's size, remembered under its record key. No
  page of a stand-in is ever touched, so it costs address space, not memory, and
  the key is the one the loader gave the storage: the plan's slots and the tree's
  tensors meet by key, never by data pointers.
- `pickle_records` runs `torch.serialization._save` (what `torch.save` runs once it
  has opened the file) with a recorder in place of torch's zip writer: it returns
  data.pkl and the small records as bytes, and the storages to write, in torch's
  order, for `memlayout.flatten.writers.torch_zip_out` to write.

Both functions are private to torch, so they are called through `memlayout._torch`,
whose tests check them against the installed torch; the signatures have been
stable since the mmap loader arrived (torch 2.1), and the flatten tests compare
the result with torch.save.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memlayout import _torch
from memlayout.errors import CorruptCheckpointError, FlattenError, UnsafeContentError, UsageError
from memlayout.io.zip_archive import ZipReader
from memlayout.load.main_module import pickle_module_resolving_main

if TYPE_CHECKING:
    import torch

DATA_FOLDER = "data/"


@dataclass
class StandIns:
    """The stand-in storage of each record key of IN, and the way back from a tensor to its key."""

    keys: dict[int, str] = field(default_factory=dict)
    """Stand-in storage identity (`_cdata`) -> IN's record key."""
    storages: dict[str, Any] = field(default_factory=dict)
    """Record key -> its stand-in `UntypedStorage` (kept alive so identities stay unique)."""

    def key_of(self, tensor: torch.Tensor) -> str | None:
        """IN's record key of the storage a tensor views; None when it views no stand-in."""
        return self.keys.get(_torch.storage_id(tensor.untyped_storage()))

    def key_of_storage(self, storage: Any) -> str | None:
        """IN's record key of an untyped storage; None when it is no stand-in."""
        return self.keys.get(_torch.storage_id(storage))


class _RecordsOfIn:
    """What `torch.serialization._load` asks of torch's zip reader, answered from IN without its data."""

    def __init__(self, archive: ZipReader, prefix: str, stand_ins: StandIns) -> None:
        self.archive = archive
        self.prefix = prefix
        self.stand_ins = stand_ins

    def has_record(self, name: str) -> bool:
        return f"{self.prefix}{name}" in self.archive.by_name

    def get_record(self, name: str) -> bytes:
        return self.archive.read(f"{self.prefix}{name}")

    def get_storage_from_record(self, name: str, nbytes: int, storage_type: Any) -> torch.Tensor:
        import torch

        key = name.removeprefix(DATA_FOLDER)
        entry = self.archive.entry(f"{self.prefix}{name}")
        if entry.size < nbytes:
            raise CorruptCheckpointError(f"storage {key} should hold {nbytes} bytes but its record has {entry.size}")
        # Never written or read: only its size and identity matter.
        stand_in = torch.empty(nbytes, dtype=torch.uint8)
        storage = stand_in.untyped_storage()
        self.stand_ins.keys[_torch.storage_id(storage)] = key
        self.stand_ins.storages[key] = storage
        return stand_in

    def serialization_id(self) -> str:
        name = f"{self.prefix}.data/serialization_id"
        return self.archive.read(name).decode("ascii", "replace") if name in self.archive.by_name else ""


def rebuild_tree(
    archive: ZipReader, prefix: str, trust: bool, path: str, main_module: str | None = None
) -> tuple[Any, StandIns]:
    """IN's object tree as `torch.load(path, map_location="cpu")` builds it, on stand-in storages.

    Args:
        archive: IN's zip, open.
        prefix: Its top folder ("archive/").
        trust: Unpickle for real (runs code from the file); otherwise torch's
            weights-only unpickler.
        path: IN, for messages.
        main_module: With `trust`, the module that defines what the pickle names `__main__.Name`.

    Returns:
        The tree, and the stand-ins that map its storages back to record keys.

    Raises:
        UnsafeContentError: the weights-only unpickler refuses the pickle.
        UsageError: a class the pickle needs cannot be imported (with trust).
        CorruptCheckpointError: a record is smaller than the pickle says.
    """
    stand_ins = StandIns()
    records = _RecordsOfIn(archive, prefix, stand_ins)
    module: Any = pickle
    if not trust:
        module = _torch.weights_only_unpickler()
    elif main_module is not None:
        module = pickle_module_resolving_main(main_module)
    try:
        root = _torch.load_pickle_from_records(records, module)
    except pickle.UnpicklingError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnsafeContentError(f"{path} cannot be loaded weights-only: {first}") from exc
    except (AttributeError, ImportError) as exc:
        raise UsageError(
            f"{path}: a class the pickle needs cannot be imported here ({exc})",
            "put the model's code on PYTHONPATH, or install its package, so that its classes import",
        ) from exc
    return root, stand_ins


@dataclass(frozen=True)
class PickledRecords:
    """What torch.save writes for a tree, in its order, with storages not yet read."""

    small: list[tuple[str, bytes]]
    """data.pkl and the bookkeeping records (.format_version, .storage_alignment,
    byteorder), by name below the archive's folder, before the storages."""
    storages: list[tuple[str, Any]]
    """(key, UntypedStorage) of every storage, in the order torch writes data/<key>."""


class _Recorder:
    """Stands in for torch's zip writer under `torch.serialization._save`: keeps what it is given."""

    def __init__(self) -> None:
        self.small: list[tuple[str, bytes]] = []
        self.storages: list[tuple[str, Any]] = []

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if name.startswith(DATA_FOLDER):
            self.storages.append((name.removeprefix(DATA_FOLDER), data))
        else:
            payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            self.small.append((name, payload[:nbytes]))

    def write_record_metadata(self, name: str, nbytes: int) -> None:
        raise CorruptCheckpointError("torch.serialization.skip_data is on; flatten cannot write without data")


def saving_pickle(locations: dict[int, str] | None = None, from_main: dict[int, str] | None = None) -> Any:
    """A pickle module for torch.save that writes what IN recorded where the objects alone would not.

    - Locations: torch.save writes each storage's location (`cpu`, `cuda:0`) into its
      persistent id `('storage', type, key, location, numel)`, and torch.load restores
      the storage there (or where `map_location` says). The bytes are the same on any
      device, so flatten moves them on the CPU and writes IN's locations: keeping a
      CUDA checkpoint's devices needs no GPU. torch's `_save` subclasses the module's
      Pickler and overrides its `persistent_id`; `__init_subclass__` wraps that method.
    - `__main__` names: a script's classes, imported under `--main-module`, carry that
      module's name, and a pickler writes a class by its `__module__`. They are
      written as `__main__.Name` again, as IN names them, so the script that loads IN
      loads OUT. Only Python's own Pickler lets a subclass decide how a global is
      written, so that one is used then (slower, and only for these files).

    Args:
        locations: storage identity (`_torch.storage_id`) -> the location to record; any other
            storage records its own.
        from_main: id(object) -> its name in `__main__`
            (`memlayout.load.main_module.objects_from_main`).

    Returns:
        An object to pass as `pickle_module` to `torch.save` or `torch.serialization._save`.
    """
    import types

    import torch

    base: Any = pickle._Pickler if from_main else pickle.Pickler
    main_names = from_main or {}

    class SavingPickler(base):  # type: ignore[misc]
        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            if not locations:
                return
            torchs_persistent_id = cls.persistent_id

            def persistent_id(self: Any, obj: Any) -> Any:
                saved_id = torchs_persistent_id(self, obj)
                if type(saved_id) is tuple and saved_id[0] == "storage":
                    storage = obj._untyped_storage if isinstance(obj, torch.storage.TypedStorage) else obj
                    location = locations.get(_torch.storage_id(storage))
                    if location is not None:
                        saved_id = (*saved_id[:3], location, *saved_id[4:])
                return saved_id

            cls.persistent_id = persistent_id

        def save_global(self, obj: Any, name: str | None = None) -> None:
            main_name = main_names.get(id(obj))
            if main_name is None:
                super().save_global(obj, name)
                return
            # What pickle's save_global writes for a global found in a module by its name.
            if self.proto >= 4:
                self.save("__main__")
                self.save(main_name)
                self.write(pickle.STACK_GLOBAL)
            else:
                self.write(pickle.GLOBAL + f"__main__\n{main_name}\n".encode())
            self.memoize(obj)

    if from_main:
        # Python's Pickler writes functions through its dispatch table, not save_global.
        SavingPickler.dispatch = {**base.dispatch, types.FunctionType: SavingPickler.save_global}

    return types.SimpleNamespace(__name__="pickle", Pickler=SavingPickler)


def pickle_records(
    root: Any, locations: dict[int, str] | None = None, from_main: dict[int, str] | None = None
) -> PickledRecords:
    """data.pkl and the records torch.save would write for `root`, storages unread.

    Args:
        root: The flat tree (every tensor on CPU).
        locations: The location each storage records, by storage identity (`_torch.storage_id`), where it is
            not its own (see `saving_pickle`).
        from_main: The objects written as `__main__.Name`, by identity (see `saving_pickle`).

    Returns:
        The small records as bytes, and the storages in writing order.

    Raises:
        FlattenError: torch refuses to save the tree (two dtypes viewing one storage).
    """
    recorder = _Recorder()
    module = saving_pickle(locations, from_main) if locations or from_main else pickle
    try:
        _torch.save_pickle_to_records(root, recorder, module)
    except RuntimeError as exc:
        raise FlattenError(f"torch cannot save the flat tree: {exc}") from exc
    return PickledRecords(recorder.small, recorder.storages)
