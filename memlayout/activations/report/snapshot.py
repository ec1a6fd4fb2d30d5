"""`--snapshot FILE`: the predicted step as the pickle `torch.cuda.memory._dump_snapshot` writes. Never written here.

The snapshot is the traced step's events through the CUDA caching allocator model
(device/memory_snapshot.py): the file PyTorch's memory viewer and
`python -m torch.cuda._memory_viz` open. It holds plain dicts, lists, numbers and
strings only, so reading it back needs no class of memlayout's or torch's.
"""

from __future__ import annotations

import pickle

from memlayout.activations.analysis import ActivationReport
from memlayout.activations.device.memory_snapshot import memory_snapshot


def snapshot_bytes(report: ActivationReport) -> bytes:
    """The report's step (the plain step it traced, without a plan) as a pickled memory snapshot."""
    return pickle.dumps(memory_snapshot(report.trace), protocol=4)
