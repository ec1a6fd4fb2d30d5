"""Write flattened objects atomically, and prove the written file holds what was meant.

OUT is written to a temporary beside it (`memlayout.io.atomic_write`), checked, and
only then fsynced and renamed over OUT; a failure leaves OUT and IN exactly as they
were. The checks: OUT read as metadata against the plan (every name's layout,
which names share a storage, every buffer's size), and its bytes, either against
the filled buffers (`verify_torch_file`) or, for an archive streamed from IN,
read back and proved against the CRC-32 of IN's bytes
(`memlayout.flatten.writers.torch_zip_verify`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memlayout.core.fact_builder import build_facts
from memlayout.errors import FlattenError
from memlayout.flatten.apply import host_bytes, pread_into
from memlayout.flatten.plan import FlatPlan, Placement
from memlayout.flatten.torch_tree import saving_pickle
from memlayout.io.atomic_write import atomic_file, fsync_path
from memlayout.load.main_module import classes_from_main
from memlayout.load.records import LoadedSource
from memlayout.load.torch_zip import load_torch_zip

if TYPE_CHECKING:
    import torch

COMPARE_CHUNK_BYTES = 8 << 20


def save_torch(
    obj: Any, path: str, locations: dict[int, str] | None = None, from_main: dict[int, str] | None = None
) -> None:
    """torch.save `obj` to `path` and fsync it.

    Args:
        obj: What to save.
        path: Where.
        locations: The location each storage records, by storage identity (`_torch.storage_id`), where it is not
            its own (`memlayout.flatten.torch_tree.saving_pickle`).
        from_main: The objects written as `__main__.Name`, by identity (the same).
    """
    import torch

    if locations or from_main:
        torch.save(obj, path, pickle_module=saving_pickle(locations, from_main))
    else:
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


def check_layout(
    path: str,
    plan: FlatPlan,
    expected_names: set[str] | None = None,
    load: Callable[[str], LoadedSource] | None = None,
    from_main: list[str] | None = None,
) -> tuple[dict[int, int], dict[int, str]]:
    """Check a written torch.save file's layout against the plan, reading it as metadata.

    Args:
        path: The file just written.
        plan: The layout it should have.
        expected_names: Names it must hold (all of IN's, for a same-format rewrite).
        load: Reads the written file as records; the torch.save zip reader by
            default (a TorchScript or torch.export archive needs its own).
        from_main: What its pickle must look up in `__main__`, as IN's does (a
            module a script saved); None does not check.

    Returns:
        (plan buffer index -> absolute file offset of its record's data,
        plan buffer index -> its record key).

    Raises:
        FlattenError: any name's layout or the sharing differs from the plan, a
            name is missing, or a buffer has the wrong size or records another device.
    """
    with (load or load_torch_zip)(path) as source:
        if from_main is not None and classes_from_main(source.pickle_globals) != from_main:
            raise FlattenError(
                f"verification failed: OUT looks up {classes_from_main(source.pickle_globals)} in __main__, "
                f"IN {from_main}: the script that saved IN could not load it the same way"
            )
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
        offsets: dict[int, int] = {}
        keys: dict[int, str] = {}
        for storage_id, index in buffer_of.items():
            storage = facts.storage(storage_id)
            if storage.nbytes != plan.buffers[index].nbytes:
                raise FlattenError(f"verification failed: buffer {plan.buffers[index].label} has the wrong size")
            if storage.device != plan.buffers[index].device:
                raise FlattenError(
                    f"verification failed: buffer {plan.buffers[index].label} records device {storage.device}, "
                    f"not {plan.buffers[index].device}"
                )
            offsets[index] = reader.data_start[storage.key]
            keys[index] = storage.key
    return offsets, keys


def verify_torch_file(
    path: str,
    plan: FlatPlan,
    buffers: list[torch.Tensor],
    expected_names: set[str] | None = None,
    load: Callable[[str], LoadedSource] | None = None,
    from_main: list[str] | None = None,
) -> None:
    """Check a written torch.save file against the plan and the filled buffers.

    Args:
        path: The file just written.
        plan: The layout it should have.
        buffers: The flat buffers whose bytes it should hold.
        expected_names: Names it must hold (all of IN's, for a same-format rewrite).
        load: Reads the written file as records (see `check_layout`).
        from_main: What its pickle must look up in `__main__` (see `check_layout`).

    Raises:
        FlattenError: any name's layout, the sharing, or any byte differs.
    """
    offsets, _ = check_layout(path, plan, expected_names, load, from_main)
    for index, offset in offsets.items():
        if not compare_bytes(path, offset, buffers[index]):
            raise FlattenError(f"verification failed: bytes of {plan.buffers[index].label} differ on disk")


def write_torch(
    obj: Any,
    out: str,
    verify: Callable[[str], None] | None,
    locations: dict[int, str] | None = None,
    from_main: dict[int, str] | None = None,
) -> bool:
    """torch.save `obj` atomically to `out`, verifying the temporary first.

    Args:
        obj: The flattened tree.
        out: The destination; replaced only after verification passes.
        verify: Called with the temporary path; raises to abort. None skips it.
        locations: The location each storage records where it is not its own (see `save_torch`).
        from_main: The objects written as `__main__.Name` (see `save_torch`).

    Returns:
        Whether OUT was verified: not with `verify` None, nor when OUT is a device
        or pipe, which is written straight into and cannot be re-read.
    """
    with atomic_file(out) as output:
        save_torch(obj, output.path, locations, from_main)
        if verify is None or output.is_stream:
            return False
        verify(output.path)
        return True
