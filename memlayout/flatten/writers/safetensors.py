"""safetensors files rewritten in flat-buffer order (see `memlayout.flatten.safetensors_out`)."""

from __future__ import annotations

from memlayout.core.facts import Facts
from memlayout.errors import UsageError
from memlayout.flatten.options import FlattenOptions
from memlayout.flatten.plan import FlatPlan
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, LayoutAfter, Written
from memlayout.load.records import LoadedSource


class SafetensorsWriter(FlattenWriter):
    """Writes the tensors in flat order with ties as metadata aliases; CPU only."""

    formats = ("safetensors",)

    def changes(self, plan: FlatPlan, facts: Facts, source: LoadedSource) -> list[str]:
        from memlayout.flatten.safetensors_out import safetensors_changes

        return safetensors_changes(plan, source)

    def layout_after(self, plan: FlatPlan, facts: Facts) -> LayoutAfter:
        # One data section, tensors back to back: the format allows no padding.
        nbytes = sum(slot.nbytes for flat in plan.buffers for slot in flat.slots)
        return LayoutAfter(1 if nbytes else 0, nbytes, 0)

    def refuse(self, source: LoadedSource, options: FlattenOptions, device: str | None) -> None:
        # safetensors records no device: its tensors are the CPU's, kept or moved there.
        if device not in (None, "cpu"):
            raise UsageError("a safetensors file is rewritten on the CPU", "pass --device cpu, or no --device")

    def write(self, job: FlattenJob) -> Written:
        from memlayout.flatten.safetensors_out import flatten_safetensors_file

        copied, verified = flatten_safetensors_file(job.path, job.out, job.source, job.plan, job.options.verify)
        return Written(copied, verified)


WRITER = SafetensorsWriter()
