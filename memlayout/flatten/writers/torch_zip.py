"""torch.save zip files rewritten flat, as a state dict or (with --trust) a module pickle.

The file is streamed: the tree is loaded with `torch.load(mmap=True)`, whose
storages are never touched, the flat buffers are allocated, and each storage's
used bytes are read from the file with pread straight into their slot. Peak
memory is the flat bytes plus one small dense-copy temporary, not two models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memlayout.errors import UnsafeContentError, UsageError
from memlayout.flatten.writers.interface import FlattenJob, FlattenWriter, Written
from memlayout.load.records import LoadedSource

if TYPE_CHECKING:
    import torch


class TorchZipWriter(FlattenWriter):
    """Streams each storage's used bytes from IN into its slot, then torch.saves the tree."""

    formats = ("torch-zip",)

    def label(self, source: LoadedSource) -> str:
        return "torch.save module pickle" if source.modules else "torch.save state dict"

    def write(self, job: FlattenJob) -> Written:
        import pickle

        import torch

        from memlayout.flatten.apply import (
            allocate,
            copy_from_file,
            mmap_storage_keys,
            rebind,
            views_of,
        )
        from memlayout.flatten.cudnn_adopt import adopt_cudnn_layouts
        from memlayout.flatten.save import verify_torch_file, write_torch

        path, plan, options = job.path, job.plan, job.options
        names = {name for tensor in job.facts.tensors for name in tensor.names}
        reader: Any = job.source.reader
        try:
            tree = torch.load(path, map_location="cpu", mmap=True, weights_only=not options.trust)
        except pickle.UnpicklingError as exc:
            raise UnsafeContentError(f"{path} cannot be loaded weights-only: {str(exc).splitlines()[0]}") from exc
        except (AttributeError, ImportError) as exc:
            raise UsageError(
                f"{path}: a class the pickle needs cannot be imported here ({exc})",
                "run from a directory where the model's code is importable",
            ) from exc
        keys = mmap_storage_keys(tree, reader.data_start, reader.data_size)
        buffers = allocate(plan)
        copied = copy_from_file(plan, buffers, path, reader.data_start)

        def key_of(tensor: torch.Tensor) -> str | None:
            storage = tensor.untyped_storage()
            return keys.get(storage.data_ptr()) if storage.nbytes() > 0 else None

        rebind(tree, plan, views_of(plan, buffers), key_of)
        # On CUDA, cuDNN lays out each RNN itself and its buffer is what gets saved.
        plan, buffers, _ = adopt_cudnn_layouts(tree, plan, buffers, job.facts)
        verify = (lambda temporary: verify_torch_file(temporary, plan, buffers, names)) if options.verify else None
        return Written(copied, write_torch(tree, job.out, verify))
