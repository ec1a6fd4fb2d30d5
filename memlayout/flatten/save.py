"""Write flattened objects atomically, and prove the written file holds what was meant.

OUT is written to a temporary file beside it, fsynced, reloaded as metadata and
compared with the plan (every name's layout, which names share a storage, every
byte of every buffer), and only then renamed over OUT. A failure leaves OUT and
IN exactly as they were.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memlayout.atomic_write import atomic_file, fsync_path
from memlayout.errors import FlattenError
from memlayout.facts import build_facts
from memlayout.flatten.plan import FlatPlan, Placement

if TYPE_CHECKING:
    import torch

COMPARE_CHUNK_BYTES = 8 << 20


def save_torch(obj: Any, path: str) -> None:
    """torch.save `obj` to `path` and fsync it."""
    import torch

    torch.save(obj, path)
    fsync_path(path)


def _expected_by_name(plan: FlatPlan) -> dict[str, tuple[int, Placement]]:
    return {name: (index, p) for index, p in plan.placements.values() for name in p.names}


def compare_bytes(path: str, file_offset: int, buffer: torch.Tensor) -> bool:
    """Whether `buffer`'s bytes equal the file's from `file_offset`, read in chunks.

    Reads go through the page cache with pread, not a map, so comparing a file as
    big as memory never doubles the process's resident memory.
    """
    import torch

    from memlayout.flatten.apply import host_bytes, pread_into

    chunk = torch.empty(min(COMPARE_CHUNK_BYTES, max(buffer.numel(), 1)), dtype=torch.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        for start in range(0, buffer.numel(), chunk.numel()):
            length = min(chunk.numel(), buffer.numel() - start)
            pread_into(fd, host_bytes(chunk)[:length], file_offset + start)
            expected = buffer[start : start + length]
            if expected.device.type != "cpu":
                expected = expected.cpu()
            if not torch.equal(chunk[:length], expected):
                return False
    finally:
        os.close(fd)
    return True


def verify_torch_file(
    path: str, plan: FlatPlan, buffers: list[torch.Tensor], expected_names: set[str] | None = None
) -> None:
    """Check a written torch.save file against the plan and the filled buffers.

    Args:
        path: The file just written.
        plan: The layout it should have.
        buffers: The flat buffers whose bytes it should hold.
        expected_names: Names it must hold (all of IN's, for a same-format rewrite).

    Raises:
        FlattenError: any name's layout, the sharing, or any byte differs.
    """
    from memlayout.load.torch_zip import load_torch_zip

    source = load_torch_zip(path)
    try:
        facts = build_facts(source)
        expected = _expected_by_name(plan)
        buffer_of: dict[str, int] = {}
        for tensor in facts.tensors:
            for name in tensor.names:
                if name not in expected:
                    if tensor.numel == 0:
                        continue
                    raise FlattenError(f"verification failed: {path} holds {name}, which was never planned")
                index, placement = expected[name]
                got = (tensor.offset, tensor.shape, tensor.stride, tensor.dtype)
                want = (placement.offset, placement.shape, placement.stride, placement.dtype)
                if got != want:
                    raise FlattenError(f"verification failed: {name} was written as {got}, planned {want}")
                if buffer_of.setdefault(tensor.storage, index) != index:
                    raise FlattenError(f"verification failed: {name} shares a storage it should not")
        if len(set(buffer_of.values())) != len(buffer_of):
            raise FlattenError("verification failed: a flat buffer was written as several storages")
        if expected_names is not None and not expected_names <= set(facts._by_name):
            missing = sorted(expected_names - set(facts._by_name))
            raise FlattenError(f"verification failed: {len(missing)} tensors missing, e.g. {missing[0]}")
        reader: Any = source.reader
        for storage_id, index in buffer_of.items():
            storage = facts.storage(storage_id)
            if storage.nbytes != plan.buffers[index].nbytes:
                raise FlattenError(f"verification failed: buffer {plan.buffers[index].label} has the wrong size")
            if not compare_bytes(path, reader.data_start[storage.key], buffers[index]):
                raise FlattenError(f"verification failed: bytes of {plan.buffers[index].label} differ on disk")
    finally:
        source.close()


def write_torch(
    obj: Any,
    out: str,
    verify: Callable[[str], None] | None,
) -> bool:
    """torch.save `obj` atomically to `out`, verifying the temporary first.

    Args:
        obj: The flattened tree.
        out: The destination; replaced only after verification passes.
        verify: Called with the temporary path; raises to abort. None skips it.

    Returns:
        Whether OUT was verified: not with `verify` None, nor when OUT is a device
        or pipe, which is written straight into and cannot be re-read.
    """
    with atomic_file(out) as output:
        save_torch(obj, output.path)
        if verify is None or output.is_stream:
            return False
        verify(output.path)
        return True
