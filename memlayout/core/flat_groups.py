"""Which flat buffer a tensor belongs in.

One rule, read by two sides: flatten's planner builds a buffer per key, and ML204
counts the keys to say how many storages flattening would leave. Kept apart from
both so that neither imports the other.
"""

from __future__ import annotations

from memlayout.core.facts import TensorFact

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
