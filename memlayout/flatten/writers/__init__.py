"""Flatten writers, picked by the loader's format name as loaders are picked by content.

Each writer is a `FlattenWriter` (see `interface.py`) that names the
`LoadedSource.format`s it rewrites, or (a converter, `flatten --to`) the format it
writes. A module of this package declares its writer as `WRITER`; a distribution
adds one through the `memlayout.flatten_writers` entry-point group, whose entry
points load to a `FlattenWriter` instance or subclass. So adding a format is
adding a module (or a plug-in), and no list here names them.

Writers are found the first time flatten asks for one, not at import: importing
this package loads no writer module, and writer modules import torch only inside
their functions, so `--check` stays light.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import pkgutil
from dataclasses import dataclass

from memlayout.errors import FlattenError
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written

ENTRY_POINT_GROUP = "memlayout.flatten_writers"
"""The entry-point group through which another distribution adds a flatten writer."""
DECLARED_AS = "WRITER"
"""The name under which a module of this package declares its writer; modules without it are helpers."""


def _origin(writer: FlattenWriter) -> str:
    kind = type(writer)
    return f"{kind.__module__}.{kind.__qualname__}"


@dataclass(frozen=True)
class Registry:
    """Every flatten writer found: this package's modules in name order, then the entry points'."""

    writers: tuple[FlattenWriter, ...]

    def _one(self, found: list[FlattenWriter], what: str) -> FlattenWriter | None:
        if len(found) > 1:
            # Two writers for one input: neither is chosen silently.
            raise FlattenError(
                f"{what} is claimed by {len(found)} flatten writers: {', '.join(_origin(w) for w in found)}",
                f"uninstall the package that adds one of them (entry-point group {ENTRY_POINT_GROUP})",
            )
        return found[0] if found else None

    def writer_for(self, source_format: str) -> FlattenWriter | None:
        """The writer that rewrites `source_format` in its own format, or None."""
        found = [w for w in self.writers if w.target is None and source_format in w.formats]
        return self._one(found, f"rewriting {source_format} sources")

    def converter_for(self, target: str, source_format: str) -> FlattenWriter | None:
        """The writer that converts `source_format` to `target`, or None."""
        found = [w for w in self.writers if w.target == target and source_format in w.formats]
        return self._one(found, f"converting {source_format} sources to {target}")

    def converters_to(self, target: str) -> tuple[FlattenWriter, ...]:
        """Every converter that writes `target`, whatever it reads."""
        return tuple(w for w in self.writers if w.target == target)

    @property
    def targets(self) -> tuple[str, ...]:
        """What `flatten --to` accepts, in the order the converters were found."""
        return tuple(dict.fromkeys(w.target for w in self.writers if w.target))


def _checked(found: object, where: str) -> FlattenWriter:
    if isinstance(found, type) and issubclass(found, FlattenWriter):
        found = found()
    if not isinstance(found, FlattenWriter) or not found.formats:
        raise FlattenError(
            f"{where} is no flatten writer: it must be a FlattenWriter naming the formats it reads",
            "fix or uninstall the package that provides it",
        )
    return found


def package_writers() -> list[FlattenWriter]:
    """The `WRITER` of every module of this package (every folder of its `__path__`), in module-name order."""
    found = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        if hasattr(loaded, DECLARED_AS):
            found.append(_checked(getattr(loaded, DECLARED_AS), f"{loaded.__name__}.{DECLARED_AS}"))
    return found


def entry_point_writers() -> list[FlattenWriter]:
    """The writers other distributions add through the `memlayout.flatten_writers` entry points.

    Raises:
        FlattenError: an entry point cannot be loaded, or is no writer.
    """
    found = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = f"the flatten writer plug-in {point.name} ({point.value})"
        try:
            loaded = point.load()
        except Exception as exc:  # a plug-in's import can fail in any way; it is named, not traced
            raise FlattenError(f"{where} cannot be loaded: {exc}",
                               "fix or uninstall the package that provides it") from exc
        found.append(_checked(loaded, where))
    return found


@functools.cache
def registry() -> Registry:
    """Every writer, found once per process: this package's modules, then the entry points."""
    return Registry((*package_writers(), *entry_point_writers()))


def writer_for(source_format: str) -> FlattenWriter | None:
    """The writer that rewrites sources of `source_format`, or None when none does.

    Args:
        source_format: A `LoadedSource.format` name ("torch-zip", "safetensors", ...).

    Returns:
        The registered writer, or None.

    Raises:
        FlattenError: two writers claim the format.
    """
    return registry().writer_for(source_format)


def converter_for(target: str, source_format: str) -> FlattenWriter | None:
    """The writer that converts sources of `source_format` to `target`, or None when none does.

    Args:
        target: A format `flatten --to` names ("safetensors").
        source_format: A `LoadedSource.format` name.

    Returns:
        The registered converter, or None.

    Raises:
        FlattenError: two converters claim the pair.
    """
    return registry().converter_for(target, source_format)


def targets() -> tuple[str, ...]:
    """What `flatten --to` accepts: the target of every converter found."""
    return registry().targets


__all__ = [
    "ENTRY_POINT_GROUP",
    "FlattenJob",
    "FlattenWriter",
    "Registry",
    "Written",
    "converter_for",
    "registry",
    "targets",
    "writer_for",
]
