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
_BY_FORMAT: dict[str, FlattenWriter] = {name: writer for writer in WRITERS for name in writer.formats}


def writer_for(source_format: str) -> FlattenWriter | None:
    """The writer that rewrites sources of `source_format`, or None when none does.

    Args:
        source_format: A `LoadedSource.format` name ("torch-zip", "safetensors", ...).

    Returns:
        The registered writer, or None.
    """
    return _BY_FORMAT.get(source_format)


__all__ = ["WRITERS", "FlattenJob", "FlattenWriter", "Written", "writer_for"]
