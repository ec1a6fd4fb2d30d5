"""TorchScript archives rewritten flat, through torch.jit.load and torch.jit.save (--trust).

Only torch can rebuild a scripted module: torch.jit.load compiles and runs the
archive's code, so flatten does this only with --trust. The module's tensors
(parameters, buffers, and plain tensor attributes such as silero-vad's `_state`)
are reached by the names memlayout's loader gives them and re-pointed into the
flat buffers; `torch.jit.save` then writes each flat buffer as one record and
`torch.jit.load` gives views of one storage back. OUT is read back by the same
loader and compared with the plan, byte for byte.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memlayout.errors import FlattenError
from memlayout.flatten.options import FlattenOptions
from memlayout.flatten.save import verify_torch_file
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.flatten.writers.loaded_tree import flatten_loaded_tree, refuse_devices_not_here
from memlayout.io.atomic_write import atomic_file
from memlayout.load.records import LoadedSource
from memlayout.load.torchscript import CODE_CONSTANTS, load_torchscript


def _tensor_at(module: Any, name: str) -> Any:
    """The live tensor a dotted name reaches in a scripted module."""
    target = module
    for part in name.split("."):
        target = getattr(target, part)
    return target


class TorchScriptWriter(FlattenWriter):
    """Loads the archive with torch.jit.load, moves its tensors into the flat buffers, saves it with torch.jit.save."""

    formats = ("torchscript",)

    def label(self, source: LoadedSource) -> str:
        return "TorchScript archive, through torch.jit.load and torch.jit.save"

    def movable(self, source: LoadedSource) -> LoadedSource:
        # Tensor constants live in the compiled code's constant table, which no
        # attribute reaches: torch.jit.save writes them as they are.
        kept = [t for t in source.tensors if t.section != CODE_CONSTANTS]
        if len(kept) == len(source.tensors):
            return source
        return dataclasses.replace(source, tensors=kept)

    def refuse(self, source: LoadedSource, options: FlattenOptions, device: str | None) -> None:
        if device is None:
            refuse_devices_not_here(source, "torch.jit.save")

    def write(self, job: FlattenJob) -> Written:
        import torch

        try:
            # Kept devices are all present here (`refuse`); moved ones are reached from the CPU.
            where = None if job.options.keeps_devices else "cpu"
            module = torch.jit.load(job.path, map_location=where)  # type: ignore[no-untyped-call]
        except RuntimeError as exc:
            raise FlattenError(f"{job.path}: torch.jit.load failed: {str(exc).splitlines()[0]}") from exc
        names = [name for tensor in job.facts.tensors for name in tensor.names]
        try:
            named = {name: _tensor_at(module, name) for name in names}
        except AttributeError as exc:
            raise FlattenError(f"{job.path}: torch.jit.load gives a module without a tensor memlayout reads "
                               f"({exc})") from exc
        done = flatten_loaded_tree(named, job)
        with atomic_file(job.out) as output:
            torch.jit.save(module, output.path)
            verified = job.options.verify and not output.is_stream
            if verified:
                verify_torch_file(
                    output.path, done.plan, done.buffers, set(names),
                    load=lambda path: self.movable(load_torchscript(path))
                )
        return Written(done.bytes_copied, verified)


WRITER = TorchScriptWriter()
