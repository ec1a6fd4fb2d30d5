"""Unpickling, under --trust, a model saved from a script, whose classes the pickle names as `__main__.Name`.

`torch.save(model)` pickles each class by the module that defines it, and a
script's classes live in `__main__`. Whoever unpickles the file later looks them up
in its own `__main__`, memlayout's entry point, and fails however the model's code
is installed. `--main-module MODULE` names the importable module that defines those
classes; `__main__.Name` is then looked up as `MODULE.Name`. Only real unpickling,
which only --trust allows, looks classes up: the restricted reading `inspect` does
never imports them, and needs no such option.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterable
from typing import Any

from memlayout.errors import SourceNotFoundError, UsageError
from memlayout.load.records import PickleGlobal

MAIN = "__main__"


def classes_from_main(pickle_globals: Iterable[PickleGlobal]) -> list[str]:
    """The names a pickle looks up in `__main__`, in the order it names them: what a script's torch.save left."""
    return [found.name for found in pickle_globals if found.module == MAIN]


def _import(module_name: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceNotFoundError(
            f"--main-module {module_name} cannot be imported: {exc}",
            f"put the folder that holds {module_name.replace('.', '/')}.py on PYTHONPATH, or install its package",
        ) from None


def objects_from_main(module_name: str, names: Iterable[str]) -> dict[int, str]:
    """What a pickle's `__main__.Name` globals resolve to in `module_name`, by identity, for writing them back.

    A pickler writes a class by its `__module__`, which is `module_name` once it is
    imported from there: a file written again from the unpickled objects would name
    `module_name.Name`, and the script that saved IN (where the class is
    `__main__.Name`) could no longer load it as it loads IN. The identities let a
    pickler write these objects as `__main__.Name` again.

    Args:
        module_name: The `--main-module` that defines them.
        names: The names the pickle looks up in `__main__` (dotted for nested classes).

    Returns:
        id(object) -> its name under `__main__`.

    Raises:
        SourceNotFoundError: `module_name` cannot be imported.
        UsageError: it does not define one of the names.
    """
    module = _import(module_name)
    found: dict[int, str] = {}
    for name in names:
        obj: Any = module
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(
                f"--main-module {module_name} defines no {name}, which the pickle looks up in __main__",
                "give the module that defines the classes of the script that saved the file",
            ) from None
        found[id(obj)] = name
    return found


def pickle_module_resolving_main(module_name: str) -> Any:
    """A stand-in for the `pickle` module, for torch.load's `pickle_module`: `__main__.X` is read as `module_name.X`.

    torch.load subclasses `pickle_module.Unpickler` for the object tree and calls
    `pickle_module.load` for a legacy file's header records; both go through the
    lookup below. Everything else a pickle names is looked up as usual.

    Raises:
        SourceNotFoundError: `module_name` cannot be imported.
    """
    # Here, not at the top: core's flatten hints ask `classes_from_main` of every source on
    # inspect's path, and pickle (about 9 ms) is needed only to unpickle.
    import pickle

    _import(module_name)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            return super().find_class(module_name if module == MAIN else module, name)

    def load(file: Any, **kwargs: Any) -> Any:
        return Unpickler(file, **kwargs).load()

    return types.SimpleNamespace(
        __name__="pickle", Unpickler=Unpickler, load=load, Pickler=pickle.Pickler, dump=pickle.dump,
    )
