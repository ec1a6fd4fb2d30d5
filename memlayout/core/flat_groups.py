"""Which flat buffer a tensor belongs in.

One rule, read by two sides: flatten's planner builds a buffer per key, and ML204
counts the keys to say how many storages flattening would leave. Kept apart from
both so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable

from memlayout.core.facts import Facts, TensorFact
from memlayout.core.flatten_support import FORMAT_SUPPORT

FlatGroupKey = tuple[str, ...]
"""(section, role, device, dtype, requires_grad) for a tensor; ("rnn", path) for an RNN's own buffer."""


def flat_group_key(tensor: TensorFact) -> FlatGroupKey:
    """The flat buffer `memlayout flatten` puts a tensor in.

    Args:
        tensor: Any tensor fact.

    Returns:
        (section, role, device, dtype, requires_grad): parameters group by all five,
        everything else by (section, device, dtype), with role "other" and "" for
        requires_grad.
    """
    role = "param" if tensor.kind.value == "parameter" else "other"
    grad = str(tensor.requires_grad) if role == "param" else ""
    return (tensor.section, role, tensor.device, tensor.dtype, grad)


def with_device(key: FlatGroupKey, device: str | None) -> FlatGroupKey:
    """The key with its device replaced, for flattening onto one target device (None keeps it)."""
    return key if device is None else (key[0], key[1], device, *key[3:])


def storages_after_flatten(facts: Facts, tensors: Iterable[TensorFact]) -> int:
    """How many storages `memlayout flatten` leaves `tensors` in (RNN buffers aside).

    A model directory is flattened file by file, so that each shard keeps its tensors
    and the index stays true: no buffer spans two files. A safetensors file is one
    data section, so it stays one storage whatever its dtypes.

    Args:
        facts: The source's facts.
        tensors: Tensors with bytes, not in an RNN's own buffer.

    Returns:
        The number of buffers their flattened files hold.
    """
    support = FORMAT_SUPPORT.get(facts.source.format)
    per_file = support is not None and support.one_storage_per_file
    file_of = {storage.id: storage.file for storage in facts.storages if storage.file}
    if per_file:
        return len({file_of.get(tensor.storage, "") for tensor in tensors})
    # flat_group_key reads only these fields, so it is asked once per distinct
    # combination rather than once per tensor of a 100,000-tensor checkpoint.
    representatives: dict[tuple[object, ...], TensorFact] = {}
    if file_of:
        for tensor in tensors:
            representatives.setdefault((file_of.get(tensor.storage, ""), tensor.section, tensor.kind,
                                        tensor.device, tensor.dtype, tensor.requires_grad), tensor)
    else:
        for tensor in tensors:
            representatives.setdefault(("", tensor.section, tensor.kind, tensor.device, tensor.dtype,
                                        tensor.requires_grad), tensor)
    buffers = {(fields[0], *flat_group_key(tensor)) for fields, tensor in representatives.items()}
    return len(buffers)


def flat_layout_phrase(facts: Facts) -> str:
    """What flatten's buffers are for this source, for ML204's hint ("one buffer per device, ...")."""
    support = FORMAT_SUPPORT.get(facts.source.format)
    directory = any(storage.file for storage in facts.storages)
    if support is not None and support.one_storage_per_file:
        return "one data section per weight file" if directory else "one data section"
    grouped = "one buffer per device, dtype and requires_grad"
    return f"{grouped} in each weight file (a shard keeps its own tensors)" if directory else grouped
