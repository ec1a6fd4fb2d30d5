"""Live objects (an import spec's model) written flat as a torch.save state dict.

A state dict is the format that needs no code to load, so a model built from an
import spec is saved as one, whatever object the spec returned.
"""

from __future__ import annotations

from memlayout.flatten.apply import allocate, copy_from_storages, rebind, views_of, walk_tensors
from memlayout.flatten.cudnn_adopt import adopt_cudnn_layouts
from memlayout.flatten.save import verify_torch_file, write_torch
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.load.live import storage_key
from memlayout.load.records import LoadedSource


class LiveObjectWriter(FlattenWriter):
    """Copies the live storages into the flat buffers, re-points the tensors, saves the state dict."""

    formats = ("live-module", "state-dict")

    def label(self, source: LoadedSource) -> str:
        return "import spec (saved as a torch.save state dict)"

    def write(self, job: FlattenJob) -> Written:
        import torch

        obj, plan, options = job.source.live_object, job.plan, job.options
        storages = {storage_key(t): t.untyped_storage() for t in walk_tensors(obj)}
        buffers = allocate(plan)
        copied = copy_from_storages(plan, buffers, storages)
        rebind(obj, plan, views_of(plan, buffers), storage_key)
        # On CUDA, cuDNN lays out each RNN itself and its buffer is what gets saved.
        plan, buffers, _ = adopt_cudnn_layouts(obj, plan, buffers, job.facts)
        state = obj.state_dict() if isinstance(obj, torch.nn.Module) else obj
        verify = (lambda temporary: verify_torch_file(temporary, plan, buffers)) if options.verify else None
        return Written(copied, write_torch(state, job.out, verify))


WRITER = LiveObjectWriter()
