"""What a checkpoint's pickle holds besides tensors, read without running it.

safetensors stores tensors only, so a conversion lists everything else (optimizer
settings, step counters, a pickled module's objects) before it writes anything.
The pickle is read again by the restricted unpickler, as every loader reads it.
"""

from __future__ import annotations

import os
from typing import Any

from memlayout.errors import FlattenError
from memlayout.io.zip_archive import ZipReader, archive_prefix
from memlayout.load.pickle_walk import is_module_state
from memlayout.load.pickled_objects import InertObject, PickledTensor
from memlayout.load.records import LoadedSource


def non_tensor_contents(source: LoadedSource) -> list[str]:
    """Everything IN's pickle holds besides tensors, one "path (type)" each; empty for a state dict.

    The pickle is read again by the restricted unpickler: nothing in it runs.

    Args:
        source: The loaded IN.

    Returns:
        Lines such as "epoch (int)" or "(root) (a pickled torch.nn.Linear module)".
    """
    if source.format == "safetensors" or source.path is None:
        return []
    root = _pickled_root(source.path, source.format)
    found: list[str] = []
    _walk_contents(root, "", found, set())
    return found


def _pickled_root(path: str, fmt: str) -> Any:
    from memlayout.load.restricted_pickle import unpickle

    if fmt == "torch-zip":
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            archive = ZipReader(fd, os.fstat(fd).st_size, 0, path)
            prefix = archive_prefix(archive.names)
            order = f"{prefix}byteorder"
            if order in archive.by_name and archive.read(order).decode("ascii", "replace") != "little":
                # torch.load swaps every value; conversion copies bytes as they are.
                raise FlattenError(f"{path} was saved on a big-endian machine",
                                   "load and re-save it with torch on a little-endian machine first")
            return unpickle(archive.read(f"{prefix}data.pkl"), what=path).root
        finally:
            os.close(fd)
    from memlayout.load.restricted_pickle import RestrictedUnpickler, run_unpickler

    # A legacy file is four pickles (magic, protocol, system info, the object), then storages.
    with open(path, "rb") as handle:
        for what in ("magic number", "protocol version", "system info"):
            run_unpickler(RestrictedUnpickler(handle, False), f"{path}: the {what} pickle")
        return run_unpickler(RestrictedUnpickler(handle, True), f"{path}: the main pickle")


def _walk_contents(obj: Any, path: str, found: list[str], seen: set[int]) -> None:
    if type(obj) is PickledTensor or id(obj) in seen:
        return
    where = path or "(root)"
    if isinstance(obj, InertObject):
        kind = "module" if is_module_state(obj.state_dict) else "object"
        found.append(f"{where} (a pickled {obj.qualified_name()} {kind})")
        return
    if isinstance(obj, (dict, list, tuple)):
        seen.add(id(obj))
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for key, value in items:
            _walk_contents(value, f"{path}.{key}" if path else str(key), found, seen)
        return
    found.append(f"{where} ({type(obj).__name__})")
