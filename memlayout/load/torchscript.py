"""TorchScript archives (`torch.jit.save`), read without torch.jit.load.

The archive is a zip like torch.save's, plus `<archive>/code/` (the compiled
TorchScript source) and `<archive>/constants.pkl`. `data.pkl` pickles the module
tree with the same `('storage', ...)` persistent ids, but differently from a
pickled `nn.Module`:

- each module is a `__torch__.<qualified class>` object whose state is one flat
  dict of attributes: parameters, buffers, submodules and plain values together;
- parameters are plain `_rebuild_tensor_v2` tensors (no `_rebuild_parameter`);
- typed lists go through `torch.jit._pickle.restore_type_tag` and
  `build_tensorlist`.

Which attributes are parameters and buffers is written in the class's source as
`__parameters__ = [...]` and `__buffers__ = [...]` lines, and an RNN's `mode` as a
`Final` constant; those lines are read as text (`ast.literal_eval`), never run.
Tensor attributes that are neither count as buffers: they are module state saved
with the module. Ties survive as pickle memo identity.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any

from memlayout.errors import CorruptCheckpointError
from memlayout.io.zip_archive import ZipReader, archive_prefix
from memlayout.load.file_source import StorageSpans, pickled_source
from memlayout.load.pickled_objects import InertObject, PickledTensor
from memlayout.load.records import LoadedSource, PickleGlobal
from memlayout.load.restricted_pickle import RestrictedUnpickler, run_unpickler

TORCHSCRIPT_MODULE = "__torch__"
_MANGLE = re.compile(r"\.___torch_mangle_\d+")
_CLASS = re.compile(r"^class (\w+)\(", re.MULTILINE)
_LIST_ATTRIBUTE = re.compile(r"^  (__parameters__|__buffers__) = (\[.*?\])\s*$", re.MULTILINE)
_MODE = re.compile(r'^  mode : Final\[str\] = "(\w+)"\s*$', re.MULTILINE)
CODE_CONSTANTS = "constants"
"""The name (and section) under which the tensor constants of the compiled code are reported."""


def _first(values: Any = None, *rest: Any) -> Any:
    return values


def _as_list(values: Any = None, *rest: Any) -> list[Any]:
    return list(values) if isinstance(values, (list, tuple)) else []


# torch.jit's own pickle helpers, answered with inert equivalents.
_TORCHSCRIPT_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch.jit._pickle", "restore_type_tag"): _first,
    ("torch.jit._pickle", "build_tensorlist"): _as_list,
    ("torch.jit._pickle", "build_intlist"): _as_list,
    ("torch.jit._pickle", "build_doublelist"): _as_list,
    ("torch.jit._pickle", "build_boollist"): _as_list,
}


class TorchScriptUnpickler(RestrictedUnpickler):
    """The restricted unpickler plus inert answers for torch.jit's list helpers."""

    def find_class(self, module: str, name: str) -> Any:
        """Resolve a global to an inert stand-in; nothing is imported.

        Args:
            module: The global's module.
            name: The global's name.

        Returns:
            A list helper stand-in, or whatever the restricted unpickler returns.
        """
        found = super().find_class(module, name)
        return _TORCHSCRIPT_GLOBALS.get((module, name), found)


def _unpickle(path: str, data: bytes, what: str) -> tuple[Any, TorchScriptUnpickler]:
    import io

    unpickler = TorchScriptUnpickler(io.BytesIO(data))
    return run_unpickler(unpickler, f"{path}: the TorchScript {what}"), unpickler


def _class_source(archive: ZipReader, prefix: str, module: str, cache: dict[str, str]) -> str:
    """The text of the code file defining classes of `module` (e.g. `__torch__.torch.nn.modules.linear`)."""
    code_path = f"{prefix}code/{module.replace('.', '/')}.py"
    if code_path not in cache:
        try:
            cache[code_path] = archive.read(code_path).decode("utf-8", "replace")
        except CorruptCheckpointError:
            # A missing or damaged code file only costs the parameter/buffer split.
            cache[code_path] = ""
    return cache[code_path]


def _class_block(source: str, name: str) -> str:
    matches = list(_CLASS.finditer(source))
    for index, match in enumerate(matches):
        if match.group(1) == name:
            end = matches[index + 1].start() if index + 1 < len(matches) else len(source)
            return source[match.start() : end]
    return ""


def _declared_names(block: str, attribute: str) -> list[str]:
    for match in _LIST_ATTRIBUTE.finditer(block):
        if match.group(1) == attribute:
            try:
                value = ast.literal_eval(match.group(2))
            except (ValueError, SyntaxError):
                return []
            return [str(v) for v in value] if isinstance(value, list) else []
    return []


def _restructure(archive: ZipReader, prefix: str, root: Any) -> None:
    """Give each TorchScript module the `_parameters/_buffers/_modules` state of a pickled nn.Module."""
    cache: dict[str, str] = {}
    seen: set[int] = set()
    pending = [root]
    while pending:
        obj = pending.pop()
        if not isinstance(obj, InertObject) or id(obj) in seen:
            continue
        seen.add(id(obj))
        cls = type(obj)
        if not cls.class_module.startswith(TORCHSCRIPT_MODULE) or not isinstance(obj.state, dict):
            continue
        block = _class_block(_class_source(archive, prefix, cls.class_module, cache), cls.class_name)
        parameter_names = set(_declared_names(block, "__parameters__"))
        attributes: dict[str, Any] = obj.state
        parameters: dict[str, Any] = {}
        buffers: dict[str, Any] = {}
        modules: dict[str, Any] = {}
        for key, value in attributes.items():
            if isinstance(value, PickledTensor):
                if key in parameter_names:
                    value.is_parameter = True
                    parameters[key] = value
                else:
                    buffers[key] = value
            elif isinstance(value, InertObject) and type(value).class_module.startswith(TORCHSCRIPT_MODULE):
                modules[key] = value
                pending.append(value)
        state = {k: v for k, v in attributes.items() if k not in parameters and k not in buffers and k not in modules}
        state.update(_parameters=parameters, _buffers=buffers, _modules=modules)
        mode = _MODE.search(block)
        if mode:
            state["mode"] = mode.group(1)
        obj.state = state
        # Report the Python class the module was scripted from, without torch.jit's mangling.
        cls.class_module = _MANGLE.sub("", cls.class_module).removeprefix(TORCHSCRIPT_MODULE + ".")


def load_torchscript(path: str) -> LoadedSource:
    """Read a TorchScript archive as layout records, without torch.jit.load.

    Args:
        path: The file written by `torch.jit.save`.

    Returns:
        A `LoadedSource` with the scripted module tree, parameters and buffers,
        and a reader over the storage records.

    Raises:
        CorruptCheckpointError: the zip or a pickle inside is damaged.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        archive = ZipReader(fd, os.fstat(fd).st_size, 0, path)
        try:
            prefix = archive_prefix(archive.names)
            data = archive.read(f"{prefix}data.pkl")
            constants_name = f"{prefix}constants.pkl"
            constants = archive.read(constants_name) if constants_name in archive.by_name else b""
            starts, sizes, _ = archive.record_spans(f"{prefix}data/")
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{path} is not a readable TorchScript archive: {exc.message}") from exc
        root, unpickler = _unpickle(path, data, "module pickle")
        referenced = dict(unpickler.referenced)
        tree: dict[str, Any] = {"": root}
        if constants:
            constants_root, constants_unpickler = _unpickle(path, constants, "constants pickle")
            referenced.update(constants_unpickler.referenced)
            tree[CODE_CONSTANTS] = constants_root
        _restructure(archive, prefix, root)
    finally:
        os.close(fd)
    # torch.jit.load reads each storage record into fresh memory; none is used in place.
    return pickled_source(
        path, "torchscript", root, StorageSpans(starts, sizes), used_in_place=False,
        pickle_globals=_python_globals(referenced),
        more_tensors={CODE_CONSTANTS: tree[CODE_CONSTANTS]} if constants else None,
        notes=[
            "TorchScript archive: torch.load(weights_only=True) refuses it, and torch.jit.load "
            "compiles and runs the TorchScript in its code/ folder"
        ],
    )


def _python_globals(referenced: dict[tuple[str, str], PickleGlobal]) -> list[PickleGlobal]:
    # __torch__ classes and torch.jit's list helpers are resolved by torch.jit.load
    # from the archive itself, not imported from Python; anything else is reported.
    return [
        g for (module, _), g in referenced.items()
        if not module.startswith(TORCHSCRIPT_MODULE) and module != "torch.jit._pickle"
    ]
