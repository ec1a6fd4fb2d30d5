"""`package.module:callable` specs: audit model code directly, as CI does.

Importing the module runs it; that is the point of a spec, which names code the
user chose, not a file somebody else wrote.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

from memlayout import _torch
from memlayout.errors import SourceNotFoundError, UsageError
from memlayout.load.records import LoadedSource

SPEC_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def looks_like_spec(text: str) -> bool:
    """True for `pkg.module:attr` (never a Windows drive path like C:\\x)."""
    return bool(SPEC_PATTERN.match(text))


def resolve_spec(spec: str) -> Any:
    """Import the module and return the object the spec names, called if callable.

    Args:
        spec: "pkg.module:attr" or "pkg.module:factory"; the current directory is
            importable, as with `python -m`.

    Raises:
        SourceNotFoundError: the module or attribute does not exist.
        UsageError: the callable needs arguments, or raised.
        TorchNotInstalledError: torch is not installed.
    """
    # A spec builds a live model, so torch comes first: the user's module would
    # otherwise fail on its own `import torch`, naming the spec rather than torch.
    _torch.require(f"the import spec {spec}")
    target = spec_object(spec)
    import torch

    if callable(target) and not isinstance(target, torch.nn.Module):
        try:
            target = target()
        except Exception as exc:
            hint = "point the spec at a factory that builds the model with no arguments"
            if "default process group twice" in str(exc):
                # Under torchrun memlayout joins the ranks' group before it calls the
                # builder (pipeline/ranks.py), as init_device_mesh would.
                hint = "memlayout has joined the ranks' process group already: call init_process_group only " \
                       "if not dist.is_initialized(), or let init_device_mesh join it"
            raise UsageError(f"calling {spec} raised {type(exc).__name__}: {exc}", hint) from exc
    return target


def spec_object(spec: str) -> Any:
    """Import the module and return the object the spec names, not called.

    Raises:
        SourceNotFoundError: the module or attribute does not exist.
        UsageError: importing the module raised.
    """
    module_name, _, attr_path = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise SourceNotFoundError(f"cannot import {module_name!r} from spec {spec!r}: {exc}") from exc
    except Exception as exc:
        # The user's own module failed while importing; say so in one line.
        raise UsageError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exc}", "run it with --debug for the traceback"
        ) from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise SourceNotFoundError(f"{module_name!r} has no attribute {attr_path!r}") from exc
    return target


def load_import_spec(spec: str) -> LoadedSource:
    """Build the model a spec names and read it as a live object."""
    from memlayout.load.live import (
        load_live,  # not for a path: batch asks looks_like_spec of every one
    )

    return load_live(resolve_spec(spec), path=spec)
