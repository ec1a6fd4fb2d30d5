"""Flatten writers, picked by the loader's format name as loaders are picked by content.

Each writer is a `FlattenWriter` (see `interface.py`) in a module of its own that
names the `LoadedSource.format`s it rewrites. Adding a format to flatten is adding
a module and its line in `WRITERS`. Writer modules import torch only inside their
functions, so `--check` and the registry itself stay light.
"""

from __future__ import annotations

from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.flatten.writers.legacy import LegacyWriter
from memlayout.flatten.writers.safetensors import SafetensorsWriter
from memlayout.flatten.writers.state_dict import LiveObjectWriter
from memlayout.flatten.writers.to_safetensors import SafetensorsConverter
from memlayout.flatten.writers.torch_export import TorchExportWriter
from memlayout.flatten.writers.torch_zip import TorchZipWriter
from memlayout.flatten.writers.torchscript import TorchScriptWriter

WRITERS: tuple[FlattenWriter, ...] = (
    TorchZipWriter(),
    LiveObjectWriter(),
    SafetensorsWriter(),
    LegacyWriter(),
    TorchScriptWriter(),
    TorchExportWriter(),
)
CONVERTERS: tuple[FlattenWriter, ...] = (SafetensorsConverter(),)
"""Writers of another format than IN's (`flatten --to`), each naming its `target`."""
_BY_FORMAT: dict[str, FlattenWriter] = {name: writer for writer in WRITERS for name in writer.formats}
_BY_TARGET: dict[tuple[str | None, str], FlattenWriter] = {
    (writer.target, name): writer for writer in CONVERTERS for name in writer.formats
}
TARGETS: tuple[str, ...] = tuple(dict.fromkeys(w.target for w in CONVERTERS if w.target))
"""What `flatten --to` accepts."""


def writer_for(source_format: str) -> FlattenWriter | None:
    """The writer that rewrites sources of `source_format`, or None when none does.

    Args:
        source_format: A `LoadedSource.format` name ("torch-zip", "safetensors", ...).

    Returns:
        The registered writer, or None.
    """
    return _BY_FORMAT.get(source_format)


def converter_for(target: str, source_format: str) -> FlattenWriter | None:
    """The writer that converts sources of `source_format` to `target`, or None when none does.

    Args:
        target: A format `flatten --to` names ("safetensors").
        source_format: A `LoadedSource.format` name.

    Returns:
        The registered converter, or None.
    """
    return _BY_TARGET.get((target, source_format))


__all__ = ["CONVERTERS", "TARGETS", "WRITERS", "FlattenJob", "FlattenWriter", "Written", "converter_for", "writer_for"]
