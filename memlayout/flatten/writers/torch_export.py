"""torch.export archives rewritten flat, through torch.export.load and torch.export.save (--trust).

torch.export.save writes one record per storage and describes each weight as a
view of its record, and torch.export.load rebuilds those views on one storage
per record: a flat layout survives the round trip. Only torch can rebuild the
program, and torch.export.load unpickles parts of the archive with
weights_only=False, so this needs --trust. The program's weights and lifted
constants are re-pointed into the flat buffers by the names memlayout's loader
gives them; OUT is read back by that loader and compared with the plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memlayout.core.facts import Facts
from memlayout.errors import FlattenError
from memlayout.flatten.options import FlattenOptions
from memlayout.flatten.plan import FlatPlan, describe_changes
from memlayout.flatten.save import verify_torch_file
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.flatten.writers.loaded_tree import flatten_loaded_tree, refuse_devices_not_here
from memlayout.io.atomic_write import atomic_file
from memlayout.load.pt2 import load_pt2
from memlayout.load.records import LoadedSource, TensorRecord

CONSTANTS = "constants"
OLDER_STATE_DICT = "state_dict"
"""The storage-key prefix the loader gives the older layout's weights."""


def _is_constant(record: TensorRecord) -> bool:
    # Both layouts' loaders key a lifted constant's storage under "constants/".
    return record.storage_key.startswith(CONSTANTS + "/")


class TorchExportWriter(FlattenWriter):
    """Loads the program with torch.export.load, moves its tensors into the flat buffers, saves it again."""

    formats = ("torch-export",)

    def label(self, source: LoadedSource) -> str:
        return "torch.export archive, through torch.export.load and torch.export.save"

    def changes(self, plan: FlatPlan, facts: Facts, source: LoadedSource) -> list[str]:
        lines = describe_changes(plan, facts)
        if any(t.storage_key.startswith(OLDER_STATE_DICT + "/") for t in source.tensors):
            # torch.export.save writes only the current layout.
            lines.insert(0, "the format: torch.export's older layout (torch 2.1-2.7) becomes the current pt2 archive")
        return lines

    def movable(self, source: LoadedSource) -> LoadedSource:
        # torch.export.save writes the program's weights and its lifted constants to
        # separate records (data/weights/, data/constants/), so one buffer must never
        # hold both: the constants are planned as a section of their own.
        if not any(_is_constant(t) for t in source.tensors):
            return source
        tensors = [t._replace(section=CONSTANTS) if _is_constant(t) else t for t in source.tensors]
        return dataclasses.replace(source, tensors=tensors)

    def refuse(self, source: LoadedSource, options: FlattenOptions, device: str | None) -> None:
        if device is None:
            refuse_devices_not_here(source, "torch.export.save")

    def write(self, job: FlattenJob) -> Written:
        import torch

        try:
            program = torch.export.load(job.path)
        except Exception as exc:  # torch.export.load raises many kinds on archives it cannot rebuild
            raise FlattenError(f"{job.path}: torch.export.load failed: {str(exc).splitlines()[0]}") from exc
        named: dict[str, Any] = {
            name: value
            for name, value in (*program.state_dict.items(), *program.constants.items())
            if isinstance(value, torch.Tensor)
        }
        done = flatten_loaded_tree(named, job)
        names = {name for tensor in job.facts.tensors for name in tensor.names}
        with atomic_file(job.out) as output:
            with output.open() as stream:
                torch.export.save(program, stream)
            verified = job.options.verify and not output.is_stream
            if verified:
                verify_torch_file(output.path, done.plan, done.buffers, names, load=load_pt2)
        return Written(done.bytes_copied, verified)


WRITER = TorchExportWriter()
